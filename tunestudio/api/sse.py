"""A job's event stream as Server-Sent Events: replay after Last-Event-ID, then live, with heartbeats.

Live events come from the manager's pump thread straight into an asyncio
queue (`call_soon_threadsafe`), so a client hears an event as soon as it is
numbered; nothing polls.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterator

from sse_starlette import EventSourceResponse, ServerSentEvent

from tunestudio.api.errors import ApiError
from tunestudio.jobs import INT64_MAX, JobEvent, JobManager, StoreUnavailable, Subscription

log = logging.getLogger(__name__)
# What reading the store may raise when the disk is full or failing.
READ_ERRORS = (sqlite3.Error, OSError, StoreUnavailable)


def last_event_id(header: str | None, query: int | None) -> int:
    for raw in (header, query):
        if raw is None:
            continue
        try:
            return min(max(0, int(raw)), INT64_MAX)  # SQLite cannot compare with a larger integer
        except (TypeError, ValueError):
            continue
    return 0


def job_events(
    manager: JobManager, job_id: str, after_seq: int, heartbeat_s: float, is_disconnected: Callable
) -> AsyncIterator[JobEvent | None]:
    """The job's events after `after_seq`, ending with its final status; None means "heartbeat now".

    Called in the event loop before the answer starts: it subscribes and reads the first page of the replay
    here, so a database that cannot be read (a full disk, an I/O error) is a 503, not a 200 with no body.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[JobEvent] = asyncio.Queue()
    try:
        sub = manager.subscribe(job_id, after_seq, deliver=lambda e: loop.call_soon_threadsafe(queue.put_nowait, e))
    except READ_ERRORS as exc:
        raise _unreadable(exc) from None
    try:
        first = next(sub.replay, None)
    except READ_ERRORS as exc:
        sub.close()
        raise _unreadable(exc) from None
    replay = itertools.chain([first], sub.replay) if first is not None else iter(())
    return _follow(manager, job_id, after_seq, heartbeat_s, is_disconnected, sub, queue, replay)


async def _follow(
    manager: JobManager, job_id: str, after_seq: int, heartbeat_s: float, is_disconnected: Callable,
    sub: Subscription, queue: asyncio.Queue[JobEvent], replay: Iterator[JobEvent],
) -> AsyncIterator[JobEvent | None]:
    try:
        last = after_seq
        for event in replay:
            yield event
            last = event.seq
            if event.is_end:
                return
        job = manager.get(job_id)
        if job.status.is_terminal and last >= job.last_seq and queue.empty():
            return  # nothing more will come (e.g. a job that ended before this server started)
        while True:
            try:
                event = await asyncio.wait_for(queue.get(), timeout=heartbeat_s)
            except TimeoutError:
                if await is_disconnected():
                    return
                yield None
                continue
            yield event
            if event.is_end:
                return
    finally:
        sub.close()


def _unreadable(exc: BaseException) -> ApiError:
    return ApiError(503, "store_unavailable", f"the job database cannot be read now ({exc}); try again later")


def heartbeat() -> ServerSentEvent:
    # No id: a heartbeat must not move the client's Last-Event-ID.
    return ServerSentEvent(data=json.dumps({"ts": time.time()}), event="heartbeat")


def response(source: AsyncIterator[ServerSentEvent], retry_ms: int) -> EventSourceResponse:
    async def with_retry() -> AsyncIterator[ServerSentEvent]:
        first = True
        try:
            async for item in source:
                if first:
                    item.retry = retry_ms
                    first = False
                yield item
        except READ_ERRORS as exc:  # the answer has started: end the stream with an error event, no traceback
            log.warning("an event stream ended: the job database cannot be read (%s)", exc)
            yield ServerSentEvent(event="error", data=json.dumps({"message": str(_unreadable(exc))}))

    return EventSourceResponse(with_retry(), ping=None, headers={"Cache-Control": "no-store"})
