"""How worker processes are started: a fresh interpreter (spawn), or a fork of a prewarmed server.

A spawned worker pays ~3.5 s of imports (torch, transformers, trl, peft)
before it does anything. With prewarm on (the default; TUNESTUDIO_PREWARM=0
turns it off), workers are forked from multiprocessing's forkserver, which
imported those modules once. Every job still gets a process no earlier job
touched: each is a new fork of the idle server. The server only imports: it
never runs torch code, so it has no thread pools that a fork would break. On a
machine with a GPU the imports themselves would start CUDA (bitsandbytes reads
the devices at import), which no fork could then use: there every worker is
spawned (`forks`). If it dies, `ensure_running` starts a new one at the next job.

It never outlives this process: when this process exits it is killed (atexit),
and if this process is killed, its guard (forkserver_guard.py) ends it within
0.1 s, even in the middle of its imports.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import threading
from multiprocessing import forkserver
from typing import Any

from tunestudio.jobs.forkserver_guard import PARENT_ENV
from tunestudio.process import start_context
from tunestudio.worker.child import PRELOAD

log = logging.getLogger(__name__)

# The guard first: it watches this process from the forkserver's first moment; then what a worker imports.
FORKSERVER_PRELOAD = ("tunestudio.jobs.forkserver_guard", *PRELOAD)
_stop_registered = False
_ready = threading.Event()  # warm_up's first fork returned: the preload is done, and a fork starts at once


# Device files of a GPU torch may start (NVIDIA, AMD ROCm, WSL's). On such a machine the forkserver's preload
# starts CUDA: bitsandbytes, which peft imports, reads each device's compute capability at import
# (bitsandbytes/cuda_specs.py, torch.cuda.get_device_capability), and a process forked after that cannot use CUDA
# ("Cannot re-initialize CUDA in forked subprocess"). So workers there are spawned, each a fresh interpreter.
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dxg")


def gpu_present() -> bool:
    """Whether this machine shows a GPU's device files (read without torch: the parent never imports it)."""
    return any(os.path.exists(path) for path in GPU_DEVICE_FILES)


def forks(prewarm: bool) -> bool:
    """Whether workers fork from the prewarmed forkserver: `prewarm` asked, and no GPU here (GPU_DEVICE_FILES)."""
    return prewarm and not gpu_present()


def context(prewarm: bool) -> Any:
    """The context workers start from (see `tunestudio.process.start_context`): spawn where `forks` says no."""
    global _stop_registered
    prewarm = forks(prewarm)
    if prewarm:
        # Whoever starts the forkserver (warm_up, or multiprocessing itself at a job's start), it inherits
        # this process's environment: its guard learns here whom to watch.
        os.environ[PARENT_ENV] = str(os.getpid())
        if not _stop_registered:
            atexit.register(stop)
            _stop_registered = True
    return start_context(prewarm, FORKSERVER_PRELOAD)


def stop() -> None:
    """Kill the forkserver, if this process started one (at exit: workers are stopped by then).

    A kill, not multiprocessing's own stop: that waits for the preload imports and an interpreter shutdown.
    """
    _ready.clear()
    server = forkserver._forkserver  # multiprocessing keeps no public handle on it
    pid = server._forkserver_pid
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    try:
        server._stop()  # reaps it, closes the pipe, removes its socket
    except (OSError, ChildProcessError) as exc:
        log.warning("stopping the worker forkserver: %s", exc)


def warm_up() -> threading.Thread:
    """Start (or restart) the forkserver in the background, so the first job finds it warm (none on a machine
    with a GPU, where workers are spawned: `forks`)."""

    context(True)  # the preload list must be set before the server starts

    def run() -> None:
        if not forks(True):
            return
        try:
            forkserver.ensure_running()
            # The server imports its preload before it serves its first fork: this one returns once that is done.
            probe = context(True).Process(target=_nothing, name="tunestudio-prewarm-probe")
            probe.start()
            probe.join()
            _ready.set()
        except Exception:  # a job started later retries, and fails with a reason
            log.exception("could not start the worker forkserver")

    thread = threading.Thread(target=run, name="prewarm", daemon=True)
    thread.start()
    return thread


def _nothing() -> None:
    """warm_up's probe: a fork that does nothing."""


def ready_context() -> Any | None:
    """The forkserver's context when it is warm (its preload done, its process alive), else None.

    For short children of a face (api/preview.py's dataset previews): a fork of the warm server starts in
    milliseconds, where a spawned child spends about 2 s of CPU importing; one that is not warm yet would make
    the child wait for the whole preload, so the caller spawns instead."""
    pid = forkserver._forkserver._forkserver_pid
    if not _ready.is_set() or pid is None:  # set only where `forks` said yes
        return None
    try:
        os.kill(pid, 0)
    except OSError:
        _ready.clear()
        return None
    return context(True)
