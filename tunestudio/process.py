"""Processes, for both sides: is a pid alive, signal a process group, how a worker is started and how it ended.

Standard library only: the parent (jobs/, inference/) and the child (worker/)
import it, and none may pull anything heavy through it.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


THREADS_ENV = "TUNESTUDIO_TORCH_THREADS"


def torch_threads(cores: int | None = None) -> int:
    """Torch threads for one process given `cores` (default: the usable ones), at most TUNESTUDIO_TORCH_THREADS.

    The cap is for a machine the studio shares: OpenMP threads spin while they wait, so a job with as many
    threads as cores, beside other busy processes, runs many times slower than with fewer (measured on the tiny
    model under load: 1 thread 0.04 s a step, 2 threads 0.7-1.2 s). The test suite sets it to 1.
    """
    cores = cores or usable_cores()
    cap = os.environ.get(THREADS_ENV, "").strip()
    if cap:
        if not cap.isdigit() or int(cap) < 1:
            raise ValueError(f"{THREADS_ENV} must be a whole number of threads, at least 1 (got {cap!r})")
        cores = min(cores, int(cap))
    return max(1, cores)


def gpu_count() -> int:
    """NVIDIA GPUs this process may use, without torch: CUDA_VISIBLE_DEVICES if set, else the driver's list."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    with contextlib.suppress(OSError):
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    return 0


def pid_alive(pid: int | None) -> bool:
    """Whether a process exists and is not a zombie (pid 0 or None: no)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a killed process that nobody has reaped yet is a zombie: gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return True


def kill_group(pid: int | None, sig: int) -> None:
    """Send `sig` to the process group `pid` leads; to `pid` alone if it leads none yet. Gone is fine."""
    if not pid:
        return
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)  # not yet its own group leader, or already gone
    except PermissionError:
        pass


def start_context(prewarm: bool, preload: Sequence[str] = ()) -> Any:
    """The multiprocessing context workers start from.

    prewarm=False: "spawn", a fresh interpreter per worker. prewarm=True: the
    "forkserver", which imported `preload` once; every worker is still a new
    fork of that idle server, which only ever imported and so holds no CUDA
    context and no thread pools a fork would break.
    """
    if not prewarm:
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(preload))
    return ctx



def describe_exit(code: int | None, asked: bool = False) -> str:
    """How a worker exited, in words; asked=True: after our own stop escalation (so SIGKILL is not memory)."""
    if code is None:
        return "worker did not exit"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " — possibly out of memory" if -code == signal.SIGKILL and not asked else ""
        return f"worker killed by signal {-code} ({name}){hint}"
    return f"worker exited with code {code}"
