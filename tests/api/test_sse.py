"""The SSE helpers on their own."""

from __future__ import annotations

from tunestudio.api import sse
from tunestudio.jobs.store import INT64_MAX


def test_last_event_id_prefers_the_header_and_stays_in_sqlite_range() -> None:
    assert sse.last_event_id(None, None) == 0
    assert sse.last_event_id("12", 3) == 12
    assert sse.last_event_id("not a number", 3) == 3
    assert sse.last_event_id("-5", None) == 0
    assert sse.last_event_id(str(10**30), None) == INT64_MAX  # a store query with it must not overflow
