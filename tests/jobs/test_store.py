"""The SQLite store on its own: one stream per job, progress stored once, older databases still read."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from tunestudio.events import Progress
from tunestudio.jobs.store import PROGRESS_COLUMNS, Store


def _job(store: Store, job_id: str = "job-1") -> str:
    store.insert_job({"id": job_id, "status": "queued", "config": {}, "created_at": 1.0})
    return job_id


def _record(step: int, total: int = 10, **extra: float) -> dict:
    return Progress(seq=step, step=step, total_steps=total, loss=1.0 / step, learning_rate=2e-4, ts=100.0 + step,
                    **extra).record()


def test_progress_is_stored_once_and_replayed_in_place(tmp_path: Path) -> None:
    store = Store(tmp_path / "db.sqlite")
    job = _job(store)
    store.append(job, [(1, "status", json.dumps({"status": "training"}))])
    store.append(job, metrics=[(2, _record(1)), (3, _record(2))], progress=_record(2))
    store.append(job, [(4, "log", json.dumps({"kind": "log", "message": "hello"}))])
    store.append(job, metrics=[(5, _record(3, eval_loss=0.5))], last_seq=5)
    store.flush()

    raw = sqlite3.connect(tmp_path / "db.sqlite")
    assert raw.execute("SELECT kind FROM events ORDER BY seq").fetchall() == [("status",), ("log",)]
    assert raw.execute("SELECT seq, step, total_steps FROM metrics ORDER BY seq").fetchall() == [
        (2, 1, 10), (3, 2, 10), (5, 3, 10)]

    stream = store.events_after(job)
    assert [(seq, kind) for seq, kind, _, _ in stream] == [
        (1, "status"), (2, "progress"), (3, "progress"), (4, "log"), (5, "progress")]
    seq, _, text, data = stream[4]
    assert text is None
    # What a replay rebuilds is the live event's data, field for field, and it parses as a Progress again.
    assert data == {"kind": "progress", **_record(3, eval_loss=0.5)}
    assert Progress.model_validate({**data, "seq": seq}).eval_loss == 0.5
    assert [s for s, *_ in store.events_after(job, after_seq=3)] == [4, 5]
    assert [s for s, *_ in store.events_after(job, after_seq=0, limit=2)] == [1, 2]
    assert [s for s, *_ in store.events_after(job, after_seq=1, upto=4)] == [2, 3, 4]  # a replay's page
    assert [r["step"] for r in store.metrics(job)] == [1, 2, 3]
    assert store.metrics(job)[0]["total_steps"] == 10  # a record is the whole event: a reload knows the length
    assert store.get_job(job)["progress"]["step"] == 2
    store.close()


OLD_SCHEMA = """
CREATE TABLE jobs (id TEXT PRIMARY KEY, request_id TEXT UNIQUE, status TEXT NOT NULL, phase TEXT,
    message TEXT NOT NULL DEFAULT '', error TEXT, config TEXT NOT NULL, created_at REAL NOT NULL, started_at REAL,
    finished_at REAL, output_dir TEXT, checkpoint TEXT, resumed_from TEXT REFERENCES jobs(id), final_metrics TEXT,
    progress TEXT, owner_pid INTEGER, worker_pid INTEGER, log_path TEXT, last_seq INTEGER NOT NULL DEFAULT 0);
CREATE TABLE metrics (job_id TEXT NOT NULL, step INTEGER NOT NULL, epoch REAL, loss REAL, learning_rate REAL,
    grad_norm REAL, eval_loss REAL, num_tokens INTEGER, tokens_per_second REAL, elapsed_seconds REAL,
    eta_seconds REAL, ts REAL);
CREATE INDEX metrics_job_step ON metrics (job_id, step);
CREATE TABLE events (job_id TEXT NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL, data TEXT NOT NULL,
    PRIMARY KEY (job_id, seq)) WITHOUT ROWID;
INSERT INTO jobs (id, status, config, created_at, last_seq) VALUES ('old', 'completed', '{}', 1.0, 3);
INSERT INTO metrics (job_id, step, loss, ts) VALUES ('old', 1, 0.9, 5.0);
INSERT INTO events VALUES ('old', 1, 'status', '{"status": "training"}');
INSERT INTO events VALUES ('old', 2, 'progress', '{"kind": "progress", "step": 1, "total_steps": 1, "loss": 0.9}');
INSERT INTO events VALUES ('old', 3, 'status', '{"status": "completed"}');
"""


def test_a_database_from_before_progress_moved_to_metrics_still_replays(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as raw:
        raw.executescript(OLD_SCHEMA)
    store = Store(path)
    old = store.events_after("old")
    assert [(seq, kind) for seq, kind, _, _ in old] == [(1, "status"), (2, "progress"), (3, "status")]
    assert json.loads(old[1][2])["loss"] == 0.9
    assert store.metrics("old")[0]["loss"] == 0.9
    assert store.get_job("old")["stop_request"] is None and [j["id"] for j in store.list_jobs()] == ["old"]
    second = Store(path)  # a second opening (another process) finds nothing left to add
    assert second.get_job("old")["status"] == "completed"
    second.close()
    # ... and new jobs in the same file use the new layout.
    job = _job(store, "new")
    store.append(job, metrics=[(1, _record(1))])
    store.flush()
    assert [(seq, kind) for seq, kind, _, _ in store.events_after(job)] == [(1, "progress")]
    store.close()


def test_a_stop_request_is_taken_only_as_it_was_read(tmp_path: Path) -> None:
    store = Store(tmp_path / "db.sqlite")
    job = _job(store)
    store.update_job(job, wait=True, owner_pid=4242, stop_request="stop")
    assert store.stop_requests(4242) == [(job, "stop")] and store.stop_requests(1) == []
    store.update_job(job, wait=True, stop_request="cancel")  # upgraded by another process after the read
    assert not store.take_stop_request(job, "stop")
    assert store.take_stop_request(job, "cancel")
    assert store.stop_requests(4242) == []
    store.close()


def test_every_progress_field_has_a_metrics_column(tmp_path: Path) -> None:
    """The metrics table is derived from the Progress model: a new field is a new column, also in old databases."""
    Store(tmp_path / "db.sqlite").close()
    with sqlite3.connect(tmp_path / "db.sqlite") as conn:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(metrics)")}
    assert set(Progress.model_fields) - {"kind", "seq"} <= columns
    assert set(PROGRESS_COLUMNS) == set(Progress.model_fields) - {"kind", "seq"}


def test_a_listener_hears_a_job_s_new_status_or_evaluation_once_it_is_readable(tmp_path: Path) -> None:
    store = Store(tmp_path / "db.sqlite")
    heard: list[tuple[frozenset[str], str | None]] = []

    def listener(job_ids: frozenset[str]) -> None:  # on the writer's thread, after the commit
        row = store.get_job("job-1")
        heard.append((job_ids, row["status"] if row else None))

    store.add_listener(listener)
    _job(store, "job-1")
    _job(store, "job-2")
    store.update_job("job-1", wait=True, status="running")
    store.update_job("job-1", wait=True, phase="training")  # not a status: not told
    store.append("job-2", metrics=[(1, _record(1))])  # a step's progress: not told
    store.flush()
    store.append("job-2", metrics=[(2, Progress(seq=2, step=2, total_steps=10, eval_loss=0.5, ts=1.0).record())])
    store.flush()
    store.append("job-1", events=[(3, "log", json.dumps({"kind": "log", "message": "x"}))], status="stopping")
    store.flush()
    store.remove_listener(listener)
    store.update_job("job-1", wait=True, status="stopped")
    store.close()
    assert heard == [(frozenset({"job-1"}), "queued"), (frozenset({"job-2"}), "queued"),
                     (frozenset({"job-1"}), "running"), (frozenset({"job-2"}), "running"),
                     (frozenset({"job-1"}), "stopping")]
