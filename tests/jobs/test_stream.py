"""A job's stream: numbering, storage, fan-out to subscribers, replay from the store, exactly once."""

from __future__ import annotations

import threading
from pathlib import Path

from tunestudio.events import Log, StatusEvent
from tunestudio.jobs.store import Store
from tunestudio.jobs.stream import Feed, Streams


def test_feed_numbers_stores_and_fans_out_and_a_late_subscriber_misses_nothing(tmp_path: Path) -> None:
    store = Store(tmp_path / "db.sqlite")
    try:
        store.insert_job({"id": "j", "status": "queued", "config": {}, "created_at": 0.0})
        feed = Feed("j", store)
        streams = Streams(store, poll_seconds=0.05, closing=lambda: False)
        with feed.lock:
            feed.emit([StatusEvent(seq=0, status="queued", message="queued")], status="queued")
            feed.emit(records=[{"step": s, "total_steps": 9, "loss": 1.0} for s in (1, 2)])
        early = streams.subscribe("j", 0, None, feed, live=True)
        seen: list[int] = []
        late = streams.subscribe("j", 2, lambda e: seen.append(e.seq), feed, live=True)
        with feed.lock:
            feed.emit([Log(seq=0, message="hello")])
            feed.emit([StatusEvent(seq=0, status="completed")], wait=True, status="completed")
            feed.end()
        got = [early.get(timeout=1) for _ in range(5)]
        assert [e.seq for e in got] == [1, 2, 3, 4, 5] and got[-1].is_end
        assert [e.kind for e in got] == ["status", "progress", "progress", "log", "status"]
        assert [e.seq for e in late.replay] == [3] and seen == [4, 5]  # after seq 2: each event once
        assert [e.seq for e in streams.replay("j", 0, 5)] == [1, 2, 3, 4, 5]
        early.close()
        late.close()
    finally:
        store.close()


def test_a_job_another_process_runs_is_tailed_until_its_final_status(tmp_path: Path) -> None:
    store = Store(tmp_path / "db.sqlite")
    try:
        import os

        store.insert_job({"id": "j", "status": "training", "config": {}, "created_at": 0.0, "owner_pid": os.getpid()})
        writer = Feed("j", store)  # stands for the other process's feed
        streams = Streams(store, poll_seconds=0.02, closing=lambda: False)
        sub = streams.subscribe("j", 0, None, None, live=True)  # no feed here: a tail of the store

        def other_process() -> None:
            with writer.lock:
                writer.emit([Log(seq=0, message="one")])
                writer.emit([StatusEvent(seq=0, status="completed")], wait=True, status="completed")

        threading.Thread(target=other_process).start()
        first, second = sub.get(timeout=5), sub.get(timeout=5)
        assert first is not None and second is not None
        assert (first.kind, second.kind) == ("log", "status") and second.is_end
        sub.close()
    finally:
        store.close()
