"""The store's one writer thread: batched commits, and no write lost without a word.

Whatever is queued when the thread wakes goes into one transaction. When a
commit fails for a reason that may pass (disk full, a read-only file, a lock
another process holds past the busy timeout, an I/O error), the writer:

1. retries with back-off for `retry_seconds`;
2. if it still fails, hands a `StoreUnavailable` to every caller waiting on that
   batch (a flush, a new job, a delete) at once, and drops only the writes whose
   caller was told (a refused new job is not created later behind its back);
3. keeps every other write (events, metrics, job fields such as a final status)
   in memory, in order, and tries them again every `idle_retry_seconds`, and
   before anything newer, until the database takes them; meanwhile `unwritten()`
   lets readers see the job fields that are not yet on disk.

While it is failing, one try per flush: a caller hears of the failure within
one busy timeout, not after a long hang. A write SQLite can never accept (a
value it cannot bind) is dropped alone, with an error in the log; the thread
never dies of an error.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from queue import Empty, SimpleQueue
from typing import Any

log = logging.getLogger(__name__)

Op = tuple[Any, ...]
_BOXED = ("insert", "clear_request", "delete")  # ops whose caller waits for their result


class StoreUnavailable(Exception):
    """The database does not take writes now (disk full, read-only, locked, I/O error)."""

    def __init__(self, path: object, reason: str, detail: str) -> None:
        super().__init__(f"the job database {path} does not accept writes: {reason} ({detail}); "
                         "changes already made are kept in memory and written as soon as it does")
        self.reason = reason


def failure_reason(exc: sqlite3.Error) -> str:
    """What a user can act on, from SQLite's error code."""
    code = getattr(exc, "sqlite_errorname", "") or ""
    text = str(exc).lower()
    if code.startswith("SQLITE_FULL") or "full" in text:
        return "disk full"
    if code.startswith("SQLITE_READONLY") or "readonly" in text:
        return "read-only (the file or its folder cannot be written)"
    if code.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in text:
        return "locked by another process for longer than the busy timeout"
    if code.startswith("SQLITE_IOERR") or "i/o" in text:
        return "disk I/O error"
    return text


class _Waiter:
    def __init__(self) -> None:
        self.event = threading.Event()
        self.error: StoreUnavailable | None = None


class Writer:
    """Owns the only write connection; `apply(conn, ops)` writes a list of ops without committing."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        apply: Callable[[sqlite3.Connection, list[Op]], None],
        path: object,
        retry_seconds: float = 3.0,
        idle_retry_seconds: float = 0.5,
        backlog_rows: int = 200_000,
    ) -> None:
        self.conn, self.apply, self.path = conn, apply, path
        self.retry_seconds, self.idle_retry_seconds, self.backlog_rows = retry_seconds, idle_retry_seconds, backlog_rows
        self.ops: SimpleQueue[Op] = SimpleQueue()
        self.failure: StoreUnavailable | None = None
        self._unwritten: dict[str, dict[str, Any]] = {}
        self._unwritten_lock = threading.Lock()
        self._next_try = 0.0
        self._listeners: list[Callable[[frozenset[str]], None]] = []  # replaced whole, under the lock
        self._listeners_lock = threading.Lock()
        self.thread = threading.Thread(target=self._loop, name="store-writer", daemon=True)
        self.thread.start()

    # --- the callers' side -------------------------------------------------------
    def put(self, op: Op) -> None:
        self.ops.put(op)

    def flush(self, timeout: float = 30.0) -> None:
        """Return once everything queued before this call is committed; StoreUnavailable if it could not be."""
        waiter = _Waiter()
        self.ops.put(("flush", waiter))
        if not waiter.event.wait(timeout):
            raise TimeoutError("the store did not commit within the timeout")
        if waiter.error is not None:
            raise waiter.error

    def close(self, timeout: float = 10.0) -> None:
        self.ops.put(("close",))
        self.thread.join(timeout)

    def add_listener(self, listener: Callable[[frozenset[str]], None]) -> None:
        """`listener(job_ids)` after each batch of writes, with the jobs it inserted, deleted, gave a new status or
        an evaluation (an append told so), on the writer's thread: it must return at once (e.g. set an Event). A
        batch that failed is told too (a look then finds nothing new), and a listener just removed may hear one more
        batch."""
        with self._listeners_lock:
            self._listeners = [*self._listeners, listener]

    def remove_listener(self, listener: Callable[[frozenset[str]], None]) -> None:
        with self._listeners_lock:
            self._listeners = [each for each in self._listeners if each is not listener]

    @staticmethod
    def _jobs_of(writes: list[Op]) -> frozenset[str]:
        """The jobs a listener hears of: inserted, deleted, a new status, an append marked as told (its last
        element: a status or an evaluation); not a step's progress, a log line or a resource sample."""
        ids = set()
        for op in writes:
            kind = op[0]
            if kind == "insert" and isinstance(op[1].get("id"), str):
                ids.add(op[1]["id"])
            elif kind == "delete" or (kind == "update" and "status" in op[2]) or (kind == "append" and op[5]):
                ids.add(op[1])
        return frozenset(ids)

    def _tell(self, listeners: list[Callable[[frozenset[str]], None]], ids: frozenset[str]) -> None:
        for listener in listeners:
            try:
                listener(ids)
            except Exception:  # a listener never stops the writer
                log.exception("store: a commit listener failed")

    def unwritten(self, job_id: str) -> dict[str, Any]:
        """Job fields accepted but not yet on disk (only while the database refuses writes)."""
        with self._unwritten_lock:
            return dict(self._unwritten.get(job_id, {}))

    # --- the thread --------------------------------------------------------------
    def _loop(self) -> None:
        backlog: list[Op] = []
        while True:
            batch: list[Op] = []
            with contextlib.suppress(Empty):  # failing: wake up to try the backlog again
                batch.append(self.ops.get(timeout=self.idle_retry_seconds if backlog else None))
            while not self.ops.empty() and len(batch) < 20_000:
                batch.append(self.ops.get())
            waiters = [op[1] for op in batch if op[0] == "flush"]
            closing = any(op[0] == "close" for op in batch)
            writes = backlog + [op for op in batch if op[0] not in ("flush", "close")]
            if self.failure is not None and not (waiters or closing) and time.monotonic() < self._next_try:
                backlog = writes  # failing: new writes wait for the next try instead of each costing one
                continue
            listeners = self._listeners
            touched = self._jobs_of(writes) if listeners and writes else frozenset()
            error = self._write(writes, patient=self.failure is None or closing) if writes else None
            if touched:  # a failed batch too: some of it may be committed (`_write_each`)
                self._tell(listeners, touched)
            if error is None:
                backlog = []
                if self.failure is not None:
                    log.warning("the job database takes writes again; what was kept in memory is written")
                self._set_failure(None, [])
            else:
                backlog = self._keep(writes, error)
                self._set_failure(error, backlog)
            for waiter in waiters:
                waiter.error = error
                waiter.event.set()
            if closing:
                if backlog:
                    log.error("closing the job database with %d changes unwritten: %s", len(backlog), error)
                self.conn.close()
                return

    def _write(self, writes: list[Op], patient: bool) -> StoreUnavailable | None:
        """Commit `writes` as one transaction, retrying with back-off; the error if it still fails."""
        deadline = time.monotonic() + (self.retry_seconds if patient else 0.0)
        delay = 0.05
        while True:
            try:
                self.apply(self.conn, writes)
                self.conn.commit()
                return None
            except sqlite3.OperationalError as exc:  # full, read-only, locked, I/O: it may pass
                self._rollback()
                if time.monotonic() + delay > deadline:
                    log.error("store write failed: %s", exc)
                    return StoreUnavailable(self.path, failure_reason(exc), str(exc))
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
            except Exception:  # a write SQLite can never take: find it, drop it alone
                self._rollback()
                return self._write_each(writes)

    def _write_each(self, writes: list[Op]) -> StoreUnavailable | None:
        """One transaction per op; ops that cannot be written are dropped (and logged). Commits remove ops from
        `writes`, so on a passing failure it holds exactly what is left."""
        while writes:
            op = writes[0]
            try:
                self.apply(self.conn, [op])
                self.conn.commit()
            except sqlite3.OperationalError as exc:
                self._rollback()
                return StoreUnavailable(self.path, failure_reason(exc), str(exc))
            except Exception as exc:
                self._rollback()
                log.exception("store: dropping a %s write SQLite cannot take", op[0])
                if op[0] in _BOXED:
                    op[-1]["error"] = exc
            writes.pop(0)
        return None

    def _keep(self, writes: list[Op], error: StoreUnavailable) -> list[Op]:
        """What stays in memory after a failure: everything but the ops whose callers are told it failed."""
        kept = []
        for op in writes:
            if op[0] in _BOXED:
                op[-1]["error"] = error
            else:
                kept.append(op)
        rows = sum(len(op[2]) + len(op[3]) for op in kept if op[0] == "append")
        if rows > self.backlog_rows:
            # Memory is finite: the oldest events and metric rows go (loudly); job fields, such as a status, stay.
            dropped = 0
            for i, op in enumerate(kept):
                if rows <= self.backlog_rows // 2:
                    break
                if op[0] == "append":
                    n = len(op[2]) + len(op[3])
                    kept[i] = ("update", op[1], op[4])
                    rows, dropped = rows - n, dropped + n
            log.error("the job database refuses writes (%s): dropped the %d oldest unwritten events", error.reason,
                      dropped)
        return kept

    def _set_failure(self, error: StoreUnavailable | None, backlog: list[Op]) -> None:
        self.failure = error
        self._next_try = time.monotonic() + self.idle_retry_seconds
        unwritten: dict[str, dict[str, Any]] = {}
        for op in backlog:
            if op[0] == "append" and op[4]:
                unwritten.setdefault(op[1], {}).update(op[4])
            elif op[0] == "update":
                unwritten.setdefault(op[1], {}).update(op[2])
        with self._unwritten_lock:
            self._unwritten = unwritten

    def _rollback(self) -> None:
        try:
            self.conn.rollback()
        except sqlite3.Error as exc:  # a rollback that fails leaves nothing to undo that we could act on
            log.warning("store rollback failed: %s", exc)
