"""One job's worker: start it, pump its events, stop it, and say how it ended.

Where the worker runs is the executor's business (`executor.py`: a local
process by default). The pump thread turns the executor's items into typed
events; anything malformed is logged and skipped, never fatal. Stopping
escalates: the stop command, then SIGTERM to the worker's process group after
a grace period, then SIGKILL.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import ValidationError

from tunestudio.events import Completed, Event, Failed, Stop, parse_event
from tunestudio.jobs.executor import Executor, executor_for
from tunestudio.kinds import AnyConfig, kind_of_config
from tunestudio.process import describe_exit
from tunestudio.settings import Settings
from tunestudio.worker import child
from tunestudio.worker.child import WorkerEntry

log = logging.getLogger(__name__)

OutcomeKind = Literal["completed", "stopped", "cancelled", "failed"]


@dataclass
class Outcome:
    kind: OutcomeKind
    message: str = ""
    completed: Completed | None = None


@dataclass
class _Asked:
    stop: bool = False
    cancel: bool = False


class Supervisor:
    """Keeper of one worker process.

    `on_events` is called from the pump thread with the events of one queue item
    (a burst from the worker, one or more), in seq order; `on_exit` once, from
    the same thread, after the last event, before `wait()` returns.
    """

    def __init__(
        self,
        config: AnyConfig,
        on_events: Callable[[list[Event]], None],
        *,
        on_exit: Callable[[Outcome], None] | None = None,
        target: WorkerEntry = child.main,
        log_path: Path | None = None,
        stop_grace_seconds: float = 30.0,
        save_grace_seconds: float = 300.0,
        kill_after_seconds: float = 5.0,
        exit_after_terminal_seconds: float = 15.0,
        prewarm: bool = False,
        executor: Executor | None = None,
        cache_dir: str | None = None,
    ) -> None:
        self.config = config
        self.on_events = on_events
        self.on_exit = on_exit
        self.log_path = log_path
        self.stop_grace_seconds = stop_grace_seconds
        self.save_grace_seconds = save_grace_seconds
        self.kill_after_seconds = kill_after_seconds
        self.exit_after_terminal_seconds = exit_after_terminal_seconds
        # target: the worker's entry point (tests pass scripted fake workers); used by the local executor.
        self.executor: Executor = executor or executor_for(config, target, prewarm, cache_dir=cache_dir)
        self._terminal: Completed | Failed | None = None
        self._asked = _Asked()
        self._done = threading.Event()
        self._outcome: Outcome | None = None
        self._last_seq = 0

    @classmethod
    def for_job(
        cls, config: AnyConfig, settings: Settings, target: WorkerEntry, log_path: Path,
        on_events: Callable[[list[Event]], None], on_exit: Callable[[Outcome], None],
    ) -> Supervisor:
        """The supervisor of a manager's job: its timings and its executor (executor_for) from the settings."""
        executor = executor_for(config, target, prewarm=settings.prewarm, kind=settings.executor,
                                ray_address=settings.ray_address, private_network=settings.private_network,
                                ray_worker_resources=settings.ray_worker_resources, ray_storage=settings.ray_storage,
                                cache_dir=str(settings.cache_dir()))
        return cls(config, on_events, on_exit=on_exit, target=target, log_path=log_path, executor=executor,
                   stop_grace_seconds=settings.stop_grace_seconds, save_grace_seconds=settings.save_grace_seconds,
                   kill_after_seconds=settings.kill_after_seconds,
                   exit_after_terminal_seconds=settings.exit_after_terminal_seconds)

    # --- lifecycle -------------------------------------------------------------
    def start(self) -> None:
        log_path = str(self.log_path) if self.log_path else None
        kind = kind_of_config(self.config).name
        self.executor.start(self.config.public_dict(), self.config.secrets(), log_path, kind, config=self.config)
        threading.Thread(target=self._pump, name=f"pump-{self.pid}", daemon=True).start()

    @property
    def pid(self) -> int | None:
        return self.executor.pid

    def stop(self, save: bool = True) -> None:
        """Ask the worker to stop at the next step boundary; save=False is a cancel.

        Either way the process is gone in bounded time: SIGTERM after the grace
        period (longer when saving), SIGKILL `kill_after_seconds` later.
        """
        self._asked.stop = True
        self._asked.cancel = self._asked.cancel or not save
        grace = self.save_grace_seconds if save else self.stop_grace_seconds
        threading.Thread(target=self._escalate, args=(grace,), name="escalate", daemon=True).start()
        self.executor.send(Stop(save=save))

    def cancel(self) -> None:
        self.stop(save=False)

    def wait(self, timeout: float | None = None) -> Outcome | None:
        self._done.wait(timeout)
        return self._outcome

    # --- the pump --------------------------------------------------------------
    def _pump(self) -> None:
        terminal_at: float | None = None
        while True:
            item = self.executor.next_item(timeout=0.1)
            if item is not None:
                self._handle(item)
                if self._terminal is not None and terminal_at is None:
                    terminal_at = time.monotonic()
                continue
            if not self.executor.alive():
                break
            if terminal_at is not None and time.monotonic() - terminal_at > self.exit_after_terminal_seconds:
                log.warning("worker %s reported its end but did not exit; killing it", self.pid)
                self.executor.kill(signal.SIGKILL)
        self.executor.join(timeout=5)
        self._drain()
        outcome = self._classify(self.executor.exitcode())
        self.executor.close()
        if self.on_exit is not None:
            try:
                self.on_exit(outcome)
            except Exception:
                log.exception("exit handler failed")
        self._outcome = outcome
        self._done.set()

    def _drain(self) -> None:
        while (item := self.executor.next_item(timeout=0.05)) is not None:
            self._handle(item)

    def _handle(self, item: object) -> None:
        """One queue item: one event, or several as newline-separated JSON (see QueueChannel)."""
        lines = item.split("\n") if isinstance(item, str) and "\n" in item else (item,)
        batch = [event for event in map(self._parse, lines) if event is not None]
        if not batch:
            return
        try:
            self.on_events(batch)
        except Exception:
            log.exception("event handler failed on %s", ", ".join(sorted({e.kind for e in batch})))

    def _parse(self, item: object) -> Event | None:
        """The event in one line, or None (logged) for garbage, a repeat or a second end."""
        try:
            if not isinstance(item, (str, bytes)):
                raise TypeError(f"not text: {type(item).__name__}")
            event = parse_event(item)
        except (ValidationError, TypeError, ValueError) as exc:
            log.warning("skipping malformed event from worker: %.200s", exc)
            return None
        if event.seq <= self._last_seq:
            log.warning("skipping out-of-order event seq %s after %s", event.seq, self._last_seq)
            return None
        self._last_seq = event.seq
        if isinstance(event, (Completed, Failed)):
            if self._terminal is not None:
                return None  # one end per job
            self._terminal = event
        return event

    # --- ending ----------------------------------------------------------------
    def _classify(self, code: int | None) -> Outcome:
        end = self._terminal
        if isinstance(end, Completed):
            if not end.stopped:  # early stopping ends a job completed, with its reason
                best = f"completed; {end.best.describe()}" if end.best else "completed"
                return Outcome("completed", end.reason or best, end)
            if end.saved:
                return Outcome("stopped", "stopped and saved", end)
            return Outcome("cancelled", "cancelled", end)
        if isinstance(end, Failed):
            # A rank that died first is the cause; what rank 0 then reported (a broken collective) is not.
            detail = self.executor.exit_detail()
            return Outcome("failed", f"{detail}; the job reported: {end.message}" if detail else end.message)
        if self._asked.cancel:
            return Outcome("cancelled", f"cancelled ({describe_exit(code, asked=True)})")
        return Outcome("failed", self.executor.exit_detail() or describe_exit(code))

    def _escalate(self, grace: float) -> None:
        """After a stop: SIGTERM once the grace period is over, SIGKILL after that."""
        if self._done.wait(grace):
            return
        self.executor.kill(signal.SIGTERM)
        if self._done.wait(self.kill_after_seconds):
            return
        self.executor.kill(signal.SIGKILL)
