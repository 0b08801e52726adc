"""Where a job's worker runs. The supervisor talks to an executor and to nothing lower.

An executor starts one worker, says whether it is alive and how it exited,
carries commands to it and its events back, and kills it. `LocalExecutor` runs
the worker as a process on this machine (spawned, or forked from the prewarmed
forkserver); `TorchrunExecutor` (jobs/torchrun.py) runs it as N data-parallel
ranks; a cluster executor implements the same protocol, and the supervisor's
pump, escalation and exit classification stay the same. `executor_for` is the
one place that chooses for a job; `inference_executor` is where the chat
worker (kind "inference") runs: always a local process, started like a job's
(the API and the CLI hand it to `inference.InferencePool`).
"""

from __future__ import annotations

import contextlib
import os
import queue
from typing import Any, Literal, Protocol

from tunestudio.events import Stop
from tunestudio.inference_protocol import Command
from tunestudio.jobs.prewarm import context as start_context
from tunestudio.jobs.ray_cluster import RayExecutor
from tunestudio.jobs.torchrun import TorchrunExecutor
from tunestudio.kinds import AnyConfig, kind_of_config
from tunestudio.process import kill_group
from tunestudio.settings import Settings
from tunestudio.worker import child
from tunestudio.worker.child import WorkerArgs, WorkerEntry, WorkerKind


class Executor(Protocol):
    """One worker's way of running: start, watch, talk, kill."""

    def start(
        self, public_config: dict[str, Any], secrets: dict[str, str], log_path: str | None, kind: WorkerKind = "train",
        config: Any = None,
    ) -> None:
        """Start the worker (the recipe `kind`: a kind of job, or inference); raises if it could not be started.

        config: the typed job (a kinds.py config, secrets inside) for an executor whose worker is a process of
        this machine's (it takes it as it is); one that crosses another boundary (torchrun's ranks, Ray) sends the
        JSON form and secrets, which the worker validates."""

    @property
    def pid(self) -> int | None:
        """The local process that stands for the worker (a launcher, a driver), if any."""

    def alive(self) -> bool: ...

    def join(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for the worker to exit."""

    def exitcode(self) -> int | None:
        """The exit code once it exited (negative: killed by that signal); None while it runs."""

    def send(self, command: Stop | Command) -> None:
        """Deliver a command (a job's `Stop`, an inference worker's `Command`); a worker already gone is not an
        error."""

    def next_item(self, timeout: float) -> object | None:
        """The next raw item the worker sent (JSON text, one event or several; an inference worker's `Reply`), or
        None after `timeout`."""

    def kill(self, sig: int) -> None:
        """Signal the worker and everything it started; gone already is not an error."""

    def exit_detail(self) -> str | None:
        """What the executor knows of the end beyond the exit code (which rank died, and how), or None."""

    def close(self) -> None:
        """Release what the executor holds (links, temporary files) once the worker has exited."""


class LocalExecutor:
    """The worker as a child process of this one, leading its own process group.

    Commands go down a queue. A job's events come up a queue, as JSON text; an inference worker's replies come up
    a pipe, pickled, which its generating thread writes itself (a queue's feeder thread would cost a GIL hand-over
    per token: bench/inference.py).
    """

    def __init__(self, target: WorkerEntry, prewarm: bool = False, cache_dir: str | None = None) -> None:
        self.target = target
        self.cache_dir = cache_dir
        self._ctx = start_context(prewarm)
        self._commands = self._ctx.Queue()
        self._events: Any = None  # a queue, or (kind "inference") the pipe's read end
        self._pipe = False
        self._proc: Any = None

    def start(
        self, public_config: dict[str, Any], secrets: dict[str, str], log_path: str | None, kind: WorkerKind = "train",
        config: Any = None,
    ) -> None:
        self._pipe = kind == "inference"
        if self._pipe:
            self._events, events = self._ctx.Pipe(duplex=False)
        else:
            self._events = events = self._ctx.Queue()
        args = WorkerArgs(public_config, secrets, events, self._commands, os.getpid(), log_path, kind,
                          cache_dir=self.cache_dir, config=config)
        name = "tunestudio-inference" if self._pipe else "tunestudio-worker"
        self._proc = self._ctx.Process(target=self.target, args=(args,), name=name)
        self._proc.start()
        if self._pipe:
            events.close()  # the child holds the write end now: its death is the pipe's end

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    def join(self, timeout: float) -> None:
        if self._proc is not None:
            self._proc.join(timeout=timeout)

    def exitcode(self) -> int | None:
        return self._proc.exitcode if self._proc is not None else None

    def send(self, command: Stop | Command) -> None:
        item = command.model_dump_json() if isinstance(command, Stop) else command
        with contextlib.suppress(ValueError, OSError):  # queue closed: the worker is gone already
            self._commands.put(item)

    def next_item(self, timeout: float) -> object | None:
        if self._pipe:
            try:
                if self._events.poll(timeout):
                    return self._events.recv()
            except (EOFError, OSError):
                self.join(timeout)  # the write end closed: the process is ending; do not spin on the EOF
            return None
        try:
            return self._events.get(timeout=timeout)
        except (queue.Empty, EOFError, OSError):
            return None

    def kill(self, sig: int) -> None:
        kill_group(self.pid, sig)

    def exit_detail(self) -> str | None:
        return None  # the exit code says it all

    def close(self) -> None:
        """Release the queues and the pipe (their file descriptors, a queue's feeder thread): what is unsent to a
        gone worker stays unsent."""
        with contextlib.suppress(Exception):
            self._commands.cancel_join_thread()
            self._commands.close()
        with contextlib.suppress(Exception):
            if not self._pipe:
                self._events.cancel_join_thread()
            self._events.close()


def executor_for(
    config: AnyConfig,
    target: WorkerEntry,
    prewarm: bool = False,
    kind: Literal["local", "ray"] = "local",
    ray_address: str | None = None,
    private_network: bool = False,
    ray_worker_resources: dict[str, float] | None = None,
    ray_storage: str | None = None,
    cache_dir: str | None = None,
) -> Executor:
    """The one place that decides where a job runs (kind: the `executor` setting).

    ray: Ray Train on a cluster, with num_processes workers. local: N ranks under
    torchrun for num_processes > 1, else one process of this machine.
    """
    if not kind_of_config(config).distributed:  # an export, a benchmark: always one local process
        return LocalExecutor(target, prewarm, cache_dir)
    processes = config.num_processes
    if kind == "ray":
        return RayExecutor(processes, ray_address, ray_worker_resources, ray_storage)
    if processes > 1:
        return TorchrunExecutor(processes, private_network)
    return LocalExecutor(target, prewarm, cache_dir)


def inference_executor(settings: Settings) -> LocalExecutor:
    """Where a chat worker (kind "inference") runs: a local process, whatever executor the jobs use, started as
    a job's is (from the prewarmed forkserver with `prewarm`)."""
    return LocalExecutor(child.main, settings.prewarm, cache_dir=str(settings.cache_dir()))
