"""The store when SQLite refuses writes: a lock held too long, a full disk, a value it cannot bind. Real failures."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tunestudio.jobs.store import Store, StoreUnavailable

from ..helpers.wait import wait_until


def on_disk(path: Path, job_id: str) -> dict | None:
    """The job's row as another process reads it (not through the store's memory)."""
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        row = conn.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return dict(row) if row else None
    finally:
        conn.close()


def log_event(seq: int, message: str) -> tuple[int, str, str]:
    return seq, "log", json.dumps({"kind": "log", "message": message})


def test_a_lock_held_too_long_fails_waiters_at_once_keeps_the_final_status_and_writes_it_later(
        tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    store = Store(path, busy_timeout=0.2, retry_seconds=0.5, idle_retry_seconds=0.1)
    store.insert_job({"id": "j1", "status": "training", "config": {}, "created_at": 1.0})
    store.append("j1", [log_event(1, "before")], last_seq=1)
    store.flush()

    tries: list[list[tuple]] = []  # every transaction the writer attempts, with its ops
    apply = store._writer.apply

    def counted(conn: sqlite3.Connection, ops: list[tuple]) -> None:
        tries.append(list(ops))
        apply(conn, ops)

    store._writer.apply = counted

    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process holds the write lock until the end of this block
    try:
        store.append("j1", [log_event(2, "the end")], last_seq=2, status="failed", error="boom")
        # Refused while the lock is still held: after its retries, not the flush's own 30 s TimeoutError.
        with pytest.raises(StoreUnavailable, match="locked by another process"):
            store.flush()
        # While failing, each waiter hears at once: its write is tried once, no back-off round.
        with pytest.raises(StoreUnavailable):
            store.insert_job({"id": "j2", "status": "queued", "config": {}, "created_at": 2.0})
        assert sum(any(op[0] == "insert" and op[1]["id"] == "j2" for op in ops) for ops in tries) == 1
        assert store._writer.thread.is_alive()
        # The final status is kept in memory: readers of this store see it, the file does not have it yet.
        assert store.get_job("j1")["status"] == "failed" and store.get_job("j1")["error"] == "boom"
        assert [j["status"] for j in store.list_jobs()] == ["failed"]
        assert store.failure is not None and store.failure.reason.startswith("locked")
    finally:
        other.execute("ROLLBACK")
        other.close()
    # Written as soon as the database takes writes again, without anyone asking.
    wait_until(lambda: (on_disk(path, "j1") or {}).get("status") == "failed", 10, "the kept status on disk")
    store.flush()
    assert store.failure is None
    assert on_disk(path, "j1")["last_seq"] == 2
    assert [seq for seq, *_ in store.events_after("j1")] == [1, 2]
    assert on_disk(path, "j2") is None  # its caller was told it failed: it is not created behind its back
    store.insert_job({"id": "j2", "status": "queued", "config": {}, "created_at": 2.0})
    store.close()


def test_a_full_disk_is_named_and_nothing_accepted_is_lost(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    store = Store(path, busy_timeout=0.2, retry_seconds=0.3, idle_retry_seconds=0.1)
    store.insert_job({"id": "j1", "status": "training", "config": {}, "created_at": 1.0})
    store.flush()
    writer = store._writer.conn
    # SQLite's own size cap: the database is full at its current size (a real SQLITE_FULL, as on a full disk).
    pages = writer.execute("PRAGMA page_count").fetchone()[0]
    writer.execute(f"PRAGMA max_page_count = {pages}")
    records = [(seq, {"step": seq, "loss": 1.0 / seq, "ts": float(seq)}) for seq in range(1, 3001)]
    store.append("j1", metrics=records, last_seq=3000, status="completed")
    with pytest.raises(StoreUnavailable, match="disk full"):
        store.flush()
    assert store.get_job("j1")["status"] == "completed"
    writer.execute("PRAGMA max_page_count = 1073741823")  # room again
    wait_until(lambda: (on_disk(path, "j1") or {}).get("status") == "completed", 10, "the kept writes on disk")
    store.flush()
    assert [r["step"] for r in store.metrics("j1")] == list(range(1, 3001))
    store.close()


def test_a_value_sqlite_cannot_take_is_dropped_alone_and_the_writer_lives_on(tmp_path: Path) -> None:
    store = Store(tmp_path / "db.sqlite")
    store.insert_job({"id": "j1", "status": "training", "config": {}, "created_at": 1.0})
    store.append("j1", [log_event(1, "fine")])
    store.append("j1", metrics=[(2, {"step": 2**70})])  # past SQLite's integers: OverflowError when bound
    store.append("j1", [log_event(3, "also fine")], last_seq=3)
    store.flush()
    assert [seq for seq, *_ in store.events_after("j1")] == [1, 3]
    assert store.get_job("j1")["last_seq"] == 3
    store.update_job("j1", wait=True, status="completed")
    assert store.get_job("j1")["status"] == "completed"
    store.close()
