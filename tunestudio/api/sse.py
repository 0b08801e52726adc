"""A job's event stream as Server-Sent Events: replay after Last-Event-ID, then live, with heartbeats.

Live events come from the manager's pump thread straight into an asyncio
queue (`call_soon_threadsafe`), so a client hears an event as soon as it is
numbered; nothing polls.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable

from sse_starlette import EventSourceResponse, ServerSentEvent

from tunestudio.jobs.manager import JobManager
from tunestudio.jobs.models import JobEvent
from tunestudio.jobs.store import INT64_MAX


def last_event_id(header: str | None, query: int | None) -> int:
    for raw in (header, query):
        if raw is None:
            continue
        try:
            return min(max(0, int(raw)), INT64_MAX)  # SQLite cannot compare with a larger integer
        except (TypeError, ValueError):
            continue
    return 0


async def job_events(
    manager: JobManager, job_id: str, after_seq: int, heartbeat_s: float, is_disconnected: Callable
) -> AsyncIterator[JobEvent | None]:
    """The job's events after `after_seq`, ending with its final status; None means "heartbeat now"."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[JobEvent] = asyncio.Queue()
    sub = manager.subscribe(job_id, after_seq, deliver=lambda e: loop.call_soon_threadsafe(queue.put_nowait, e))
    try:
        last = after_seq
        for event in sub.replay:
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


def heartbeat() -> ServerSentEvent:
    # No id: a heartbeat must not move the client's Last-Event-ID.
    return ServerSentEvent(data=json.dumps({"ts": time.time()}), event="heartbeat")


def response(source: AsyncIterator[ServerSentEvent], retry_ms: int) -> EventSourceResponse:
    async def with_retry() -> AsyncIterator[ServerSentEvent]:
        first = True
        async for item in source:
            if first:
                item.retry = retry_ms
                first = False
            yield item

    return EventSourceResponse(with_retry(), ping=None, headers={"Cache-Control": "no-store"})
