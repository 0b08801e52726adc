"""One job's worker process: start it, pump its events, stop it, and say how it ended.

The worker runs in a fresh interpreter (multiprocessing "spawn"), leads its own
process group and dies with its parent (see `tunestudio.worker.child`). The
pump thread turns queue items into typed events; anything malformed is counted
and skipped, never fatal. Stopping escalates: the stop command, then SIGTERM to
the worker's process group after a grace period, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import ValidationError

from tunestudio.config import JobConfig
from tunestudio.events import Completed, Event, Failed, Stop, parse_event
from tunestudio.jobs.prewarm import context as prewarm_context
from tunestudio.worker import child

log = logging.getLogger(__name__)

OutcomeKind = Literal["completed", "stopped", "cancelled", "failed"]


@dataclass
class Outcome:
    kind: OutcomeKind
    message: str = ""
    exit_code: int | None = None
    completed: Completed | None = None


@dataclass
class _Asked:
    stop: bool = False
    cancel: bool = False
    escalated: list[str] = field(default_factory=list)


def describe_exit(code: int | None) -> str:
    if code is None:
        return "worker did not exit"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " — possibly out of memory" if -code == signal.SIGKILL else ""
        return f"worker killed by signal {-code} ({name}){hint}"
    return f"worker exited with code {code}"


class Supervisor:
    """Keeper of one worker process.

    `on_events` is called from the pump thread with the events of one queue item
    (a burst from the worker, one or more), in seq order; `on_exit` once, from
    the same thread, after the last event, before `wait()` returns.
    """

    def __init__(
        self,
        config: JobConfig,
        on_events: Callable[[list[Event]], None],
        *,
        on_exit: Callable[[Outcome], None] | None = None,
        target: Callable[..., None] = child.main,
        log_path: Path | None = None,
        stop_grace_seconds: float = 30.0,
        save_grace_seconds: float = 300.0,
        kill_after_seconds: float = 5.0,
        exit_after_terminal_seconds: float = 15.0,
        prewarm: bool = False,
    ) -> None:
        self.config = config
        self.on_events = on_events
        self.on_exit = on_exit
        self.target = target  # the child's entry point; tests pass scripted fake workers
        self.log_path = log_path
        self.stop_grace_seconds = stop_grace_seconds
        self.save_grace_seconds = save_grace_seconds
        self.kill_after_seconds = kill_after_seconds
        self.exit_after_terminal_seconds = exit_after_terminal_seconds
        self.malformed_events = 0
        self._ctx = prewarm_context(prewarm)
        self._events = self._ctx.Queue()
        self._commands = self._ctx.Queue()
        self._proc: mp.process.BaseProcess | None = None
        self._terminal: Completed | Failed | None = None
        self._asked = _Asked()
        self._done = threading.Event()
        self._outcome: Outcome | None = None
        self._last_seq = 0

    # --- lifecycle -------------------------------------------------------------
    def start(self) -> None:
        self._proc = self._ctx.Process(
            target=self.target,
            args=(
                self.config.public_dict(),
                self.config.secrets(),
                self._events,
                self._commands,
                os.getpid(),
                str(self.log_path) if self.log_path else None,
            ),
            name="tunestudio-worker",
        )
        self._proc.start()
        threading.Thread(target=self._pump, name=f"pump-{self._proc.pid}", daemon=True).start()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def stop(self, save: bool = True) -> None:
        """Ask the worker to stop at the next step boundary; save=False is a cancel.

        Either way the process is gone in bounded time: SIGTERM after the grace
        period (longer when saving), SIGKILL `kill_after_seconds` later.
        """
        self._asked.stop = True
        self._asked.cancel = self._asked.cancel or not save
        grace = self.save_grace_seconds if save else self.stop_grace_seconds
        threading.Thread(target=self._escalate, args=(grace,), name="escalate", daemon=True).start()
        with contextlib.suppress(ValueError, OSError):  # queue closed: the worker is gone already
            self._commands.put(Stop(save=save).model_dump_json())

    def cancel(self) -> None:
        self.stop(save=False)

    def wait(self, timeout: float | None = None) -> Outcome | None:
        self._done.wait(timeout)
        return self._outcome

    # --- the pump --------------------------------------------------------------
    def _pump(self) -> None:
        assert self._proc is not None
        terminal_at: float | None = None
        while True:
            try:
                item = self._events.get(timeout=0.1)
            except queue.Empty:
                item = None
            except (EOFError, OSError):
                item = None
            if item is not None:
                self._handle(item)
                if self._terminal is not None and terminal_at is None:
                    terminal_at = time.monotonic()
                continue
            if not self._proc.is_alive():
                break
            if terminal_at is not None and time.monotonic() - terminal_at > self.exit_after_terminal_seconds:
                log.warning("worker %s reported its end but did not exit; killing it", self._proc.pid)
                self._kill_group(signal.SIGKILL)
        self._proc.join(timeout=5)
        self._drain()
        outcome = self._classify(self._proc.exitcode)
        if self.on_exit is not None:
            try:
                self.on_exit(outcome)
            except Exception:
                log.exception("exit handler failed")
        self._outcome = outcome
        self._done.set()

    def _drain(self) -> None:
        while True:
            try:
                item = self._events.get(timeout=0.05)
            except (queue.Empty, EOFError, OSError):
                return
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
        """The event in one line, or None (counted and logged) for garbage, a repeat or a second end."""
        try:
            if not isinstance(item, (str, bytes)):
                raise TypeError(f"not text: {type(item).__name__}")
            event = parse_event(item)
        except (ValidationError, TypeError, ValueError) as exc:
            self.malformed_events += 1
            log.warning("skipping malformed event from worker: %.200s", exc)
            return None
        if event.seq <= self._last_seq:
            self.malformed_events += 1
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
            if not end.stopped:
                return Outcome("completed", "completed", code, end)
            if end.saved:
                return Outcome("stopped", "stopped and saved", code, end)
            return Outcome("cancelled", "cancelled", code, end)
        if isinstance(end, Failed):
            return Outcome("failed", end.message, code)
        if self._asked.cancel:
            return Outcome("cancelled", f"cancelled ({describe_exit(code)})", code)
        return Outcome("failed", describe_exit(code), code)

    def _escalate(self, grace: float) -> None:
        """After a stop: SIGTERM once the grace period is over, SIGKILL after that."""
        assert self._proc is not None
        if self._done.wait(grace):
            return
        self._asked.escalated.append("SIGTERM")
        self._kill_group(signal.SIGTERM)
        if self._done.wait(self.kill_after_seconds):
            return
        self._asked.escalated.append("SIGKILL")
        self._kill_group(signal.SIGKILL)

    def _kill_group(self, sig: signal.Signals) -> None:
        pid = self.pid
        if pid is None:
            return
        try:
            os.killpg(pid, sig)  # the worker leads its own group
        except ProcessLookupError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)  # not yet its own group leader, or already gone
        except PermissionError:
            pass
