"""The first code a supervised worker process runs.

The parent references `main` to spawn the process, so this module imports
nothing heavy at the top: torch and friends load inside `main`, in the child.

Before the job starts, the child makes sure it can never outlive its parent:
it leads its own process group (so the supervisor can signal the whole group),
asks the kernel for SIGKILL when the parent dies (PR_SET_PDEATHSIG), and, as a
fallback, watches the parent's pid.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

from tunestudio.kinds import spec_of
from tunestudio.process import pid_alive

# A job kind of tunestudio.kinds (its recipe), or "inference": the chat worker, which is no job.
WorkerKind = str
PR_SET_PDEATHSIG = 1
PARENT_POLL_S = 0.5

# What a worker imports on its way to the first step (see worker/main.py): a prewarmed
# forkserver imports these once, so each job's fork starts with them loaded.
PRELOAD = (
    "tunestudio.worker.channel",
    "tunestudio.worker.main",
    "tunestudio.worker.train.model",
    "tunestudio.worker.train.performance",
    "tunestudio.worker.data",
    "tunestudio.worker.train.train",
)


@dataclass(frozen=True)
class WorkerArgs:
    """Everything a worker process is started with.

    public_config: the job's config without secrets (JSON-ready); secrets travel
    beside it and are never written anywhere. events/commands: the two queues
    of the protocol in `tunestudio.events` (kind "inference": the reply pipe's
    write end and the command queue of `tunestudio.inference_protocol`).
    parent_pid: the process the worker must not outlive. kind: which recipe
    runs: a kind of job of `tunestudio.kinds` (its entry names the recipe and
    the config it reads), or "inference" (worker/serve/inference.py: chat, no config).
    cache_dir: where the worker may keep measured decisions between jobs.
    config: the typed job as the manager validated and resolved it at submit (its secrets inside), when the
    worker is a process this machine starts for it: the recipe takes it as it is and re-checks only what can
    change before the start (its inputs still there). None (a rank under torchrun or Ray, which receive the
    JSON form across their own boundary; a scripted fake): the recipe validates public_config and secrets.
    """

    public_config: dict[str, Any]
    secrets: dict[str, str]
    events: Any
    commands: Any
    parent_pid: int
    log_path: str | None = None
    kind: WorkerKind = "train"
    cache_dir: str | None = None
    config: Any = None


class WorkerEntry(Protocol):
    """A worker's entry point: `main` below, or a scripted fake in the tests."""

    def __call__(self, args: WorkerArgs) -> None: ...


def die_with_parent(manager_pid: int) -> None:
    """Exit (with the whole process group) as soon as the manager process is gone.

    Our direct parent is the manager (spawn), the prewarmed forkserver, which
    itself exits when the manager does, or (a rank, a Ray driver) a launcher
    that dies with the manager in turn. PR_SET_PDEATHSIG covers the direct
    parent; the watch covers the manager itself, a parent that died before
    prctl ran, and PDEATHSIG's quirk of firing when the parent *thread* ends.
    """
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # the watch below still holds
    first_parent = os.getppid()
    if first_parent == 1 or not pid_alive(manager_pid):
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(PARENT_POLL_S)
            if os.getppid() != first_parent or not pid_alive(manager_pid):
                os.killpg(os.getpgid(0), signal.SIGKILL)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def redirect_output(log_path: str | None) -> None:
    """Library chatter (warnings, progress bars) goes to the job's log file, not the parent's terminal."""
    if not log_path:
        return
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def become_worker(args: WorkerArgs) -> None:
    """The first steps of every worker: its own process group, death with its parent, output to its log."""
    os.setpgid(0, 0)
    die_with_parent(args.parent_pid)
    redirect_output(args.log_path)


def main(args: WorkerArgs) -> None:
    become_worker(args)
    # A stop is a command, not a signal: Ctrl-C in the parent's terminal must not reach us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    code = 1
    try:
        code = run(args)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    # A worker that hangs in teardown after this is killed by the supervisor's exit bound.
    sys.exit(code)


GC_FREEZE_ENV = "TUNESTUDIO_GC_FREEZE"


def freeze_imports(trains: bool = False) -> None:
    """Everything the worker holds so far, its modules, leaves the garbage collector's sight (`gc.freeze`). A full
    collection walked all of it: accelerate runs one as training starts, and the collector's own runs come while a
    job trains or a chat answers; 0.45 s each time in a worker holding the forkserver's preload (about 560,000
    objects; bench/worker_gc.py), and each wrote to the headers of objects a fork shares with its forkserver.
    Modules are never garbage, so nothing is lost; what the job makes after this (a model, its data) is collected as
    usual, so a model the chat worker unloads is still freed.

    A fork of the forkserver holds the preload already. trains=True (a training job's worker or rank, spawned on a
    machine with a GPU or with prewarm off) imports `PRELOAD` first, as the job would moments later. A spawned chat
    worker freezes only what it has at its start: its libraries load with its first model.
    TUNESTUDIO_GC_FREEZE=0 leaves everything in sight (bench/worker_gc.py compares both)."""
    if trains:
        for module in PRELOAD:
            try:
                importlib.import_module(module)
            except Exception:  # a broken install: the recipe meets it again inside its own try and reports it
                break
    if os.environ.get(GC_FREEZE_ENV, "1") != "0":
        gc.freeze()


def run(args: WorkerArgs) -> int:
    """The recipe of the worker's kind (tunestudio.kinds), or the chat worker's loop; its exit code."""
    if args.kind == "inference":
        from tunestudio.worker.serve import run as serve

        freeze_imports()
        return serve(args.commands, args.events, args.cache_dir)

    from tunestudio.worker.channel import QueueChannel
    from tunestudio.worker.optional import hide_unused
    from tunestudio.worker.resources import Sampler

    spec = spec_of(args.kind)
    given = args.config if args.config is not None else args.public_config
    if spec.trains:  # a spawned worker: what the job never imports stays unloaded (worker/optional.py)
        hide_unused(given)
    module, _, function = spec.recipe.partition(":")
    recipe = getattr(importlib.import_module(module), function)
    freeze_imports(trains=spec.trains)
    channel = QueueChannel(args.events, args.commands)
    sampler = Sampler(channel).start()  # CPU, memory (and GPU) of this worker and its children, over time
    try:
        return recipe(given, channel, args.secrets, cache_dir=args.cache_dir)
    finally:
        sampler.stop()
        channel.close()
