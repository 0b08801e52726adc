"""A job's event stream: numbering, storing, fan-out, replay, and following another process's job.

A live job this process runs has a `Feed`: every event of its stream (the
worker's, and the manager's own status changes) is numbered there, stored with
any job fields as one write, then handed to its subscribers. A `Subscription`
first replays what the store holds, a page at a time, then delivers the live
events, each exactly once. A job another process runs (a `tunestudio train`
beside a server) is followed by tailing the store until its final status.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from tunestudio.jobs.models import JobEvent
from tunestudio.jobs.status import JobStatus
from tunestudio.jobs.store import INT64_MAX, Store, StoreUnavailable
from tunestudio.process import pid_alive

log = logging.getLogger(__name__)


class StreamMessage(Protocol):
    """An event model of `tunestudio.events` (a worker's event or a StatusEvent)."""

    kind: str

    def model_dump_json(self, *, exclude: set[str]) -> str: ...


class Subscription:
    """Events of one job after a given seq: first the stored ones, then live ones as they happen.

    `deliver` (if given) is called for each live event from the pump thread and
    must not block; otherwise events are buffered for `get()`.
    """

    def __init__(self, job_id: str, deliver: Callable[[JobEvent], None] | None) -> None:
        self.job_id = job_id
        self.replay: Iterator[JobEvent] = iter(())  # the stored events, read from the store a page at a time
        self._replaying = True
        self._buffer: deque[JobEvent] = deque()
        self._ready = threading.Condition()
        self._deliver = deliver
        self.closed = False
        self._closed_event = threading.Event()  # wakes a store tail on close
        self._on_close: Callable[[Subscription], None] | None = None

    def push(self, event: JobEvent) -> None:
        if self._deliver is not None:
            self._deliver(event)
            return
        with self._ready:
            self._buffer.append(event)
            self._ready.notify_all()

    def get(self, timeout: float | None = None) -> JobEvent | None:
        """The next event (replayed ones first), or None after `timeout` seconds."""
        if self._replaying:
            event = next(self.replay, None)
            if event is not None:
                return event
            self._replaying = False
        with self._ready:
            if not self._buffer:
                self._ready.wait(timeout)
            return self._buffer.popleft() if self._buffer else None

    def wait_closed(self, timeout: float) -> bool:
        return self._closed_event.wait(timeout)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._closed_event.set()
            if self._on_close is not None:
                self._on_close(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Feed:
    """The live stream of one job this process runs. Callers hold `lock` around `emit` and `attach`."""

    def __init__(self, job_id: str, store: Store, seq: int = 0) -> None:
        self.job_id = job_id
        self.store = store
        self.lock = threading.Lock()
        self.seq = seq  # the last event numbered
        self.subscribers: list[Subscription] = []

    def emit(
        self,
        events: Sequence[StreamMessage] = (),
        records: Sequence[dict[str, Any]] = (),
        wait: bool = False,
        **fields: Any,
    ) -> None:
        """Number events, store them with any job fields as one write, and fan them out.

        events: event models of any kind but progress; records: the metric
        records of progress events, which the store keeps as metrics rows.
        wait=True: committed before anyone hears of them (a final status).
        """
        stored = [(seq, e.kind, e.model_dump_json(exclude={"seq"})) for seq, e in enumerate(events, self.seq + 1)]
        self.seq += len(stored)
        metrics = list(enumerate(records, start=self.seq + 1))
        self.seq += len(metrics)
        self.store.append(self.job_id, stored, metrics, last_seq=self.seq, **fields)
        if wait:
            try:
                self.store.flush()
            except StoreUnavailable as exc:
                # The store keeps it in memory and writes it when it can; the streams must still hear of it.
                log.error("job %s: %s", self.job_id, exc)
        if not self.subscribers:
            return
        batch = [JobEvent(seq, kind, text) for seq, kind, text in stored]
        batch += [JobEvent(seq, "progress", data={"kind": "progress", **record}) for seq, record in metrics]
        for sub in list(self.subscribers):
            try:
                for event in batch:
                    sub.push(event)
            except Exception:
                log.exception("subscriber of job %s failed; dropping it", self.job_id)
                self.subscribers.remove(sub)

    def attach(self, sub: Subscription) -> None:
        self.subscribers.append(sub)
        sub._on_close = self._detach

    def _detach(self, sub: Subscription) -> None:
        with self.lock, contextlib.suppress(ValueError):
            self.subscribers.remove(sub)

    def end(self) -> None:
        """The stream is over (its final status is out): let go of the subscribers."""
        self.subscribers.clear()


class Streams:
    """Subscriptions to jobs' streams, from the store and from live feeds."""

    def __init__(self, store: Store, poll_seconds: float, closing: Callable[[], bool]) -> None:
        self.store = store
        self.poll_seconds = poll_seconds
        self._closing = closing

    def subscribe(
        self, job_id: str, after_seq: int, deliver: Callable[[JobEvent], None] | None, feed: Feed | None,
        live: bool,
    ) -> Subscription:
        """Events after `after_seq`, each once. feed: the job's feed if this process runs it; live: it still runs."""
        sub = Subscription(job_id, deliver)
        lock = feed.lock if feed is not None else contextlib.nullcontext()
        with lock:
            # Holding the feed's lock, no new event can be numbered: the store plus the
            # live feed from here on is exactly the stream, once.
            self.store.flush()
            row = self.store.get_job(job_id) or {}  # status and last_seq from one read
            upto = feed.seq if feed is not None else row.get("last_seq") or 0
            sub.replay = self.replay(job_id, after_seq, upto)
            if feed is not None and live:
                feed.attach(sub)
            elif feed is None and row and JobStatus(row["status"]).is_live:
                # Another process runs it (a `tunestudio train` beside this server): follow it in the store.
                start = max(after_seq, upto)
                threading.Thread(target=self._tail, args=(sub, start), name=f"tail-{job_id}", daemon=True).start()
        return sub

    def replay(self, job_id: str, after_seq: int, upto: int, page: int = 2000) -> Iterator[JobEvent]:
        """The stored events in (after_seq, upto], a page at a time: a 100k-event replay is never all in memory."""
        while after_seq < upto:
            rows = self.store.events_after(job_id, after_seq, limit=page, upto=upto)
            if not rows:
                return
            for seq, kind, text, data in rows:
                yield JobEvent(seq, kind, text, data)
            after_seq = rows[-1][0]

    def _tail(self, sub: Subscription, after_seq: int) -> None:
        """Deliver the events another process stores for the job, until its final status or `sub.close()`."""
        job_id = sub.job_id
        while not sub.closed and not self._closing():
            try:
                new = False
                for event in self.replay(job_id, after_seq, INT64_MAX):  # what is stored now, a page at a time
                    sub.push(event)
                    after_seq, new = event.seq, True
                    if event.is_end:
                        return
                if not new:
                    row = self.store.get_job(job_id)
                    if row is None or (JobStatus(row["status"]).is_terminal and row["last_seq"] <= after_seq):
                        return
                    if JobStatus(row["status"]).is_live and not pid_alive(row["owner_pid"] or 0):
                        return  # its process died: nothing more will come (the next start marks it interrupted)
                    sub.wait_closed(self.poll_seconds)
            except Exception:
                log.exception("following job %s in the store failed", job_id)
                return
