"""The tracker: statuses only through the transition table, the worker's events applied, exits recorded."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunestudio.events import Completed, Failed, Log, Phase, Progress
from tunestudio.jobs.status import IllegalTransition, JobStatus
from tunestudio.jobs.store import Store
from tunestudio.jobs.stream import Streams
from tunestudio.jobs.supervisor import Outcome
from tunestudio.jobs.tracker import Tracker

S = JobStatus


@pytest.fixture
def store(tmp_path: Path):
    store = Store(tmp_path / "db.sqlite")
    store.insert_job({"id": "j", "status": "queued", "config": {}, "created_at": 0.0})
    yield store
    store.close()


def kinds(store: Store) -> list[tuple[str, str | None]]:
    events = Streams(store, 0.05, lambda: False).replay("j", 0, 10**9)
    return [(e.kind, e.data.get("status") or e.data.get("phase")) for e in events]


def test_a_worker_that_dies_without_a_word_fails_with_a_failed_event(store: Store) -> None:
    tracker = Tracker(store)
    tracker.track("j")
    for status in (S.starting, S.loading_model):
        tracker.set_status("j", status)
    tracker.on_events("j", [Phase(seq=1, phase="loading_dataset"), Phase(seq=2, phase="training"),
                            Progress(seq=3, step=1, total_steps=2, loss=1.0),
                            Progress(seq=4, step=2, total_steps=2, loss=0.5), Log(seq=5, message="x")])
    tracker.record_exit("j", Outcome("failed", "worker killed by signal 9 (SIGKILL)"))
    row = store.get_job("j")
    assert row["status"] == "failed" and "signal 9" in row["error"] and row["progress"]["step"] == 2
    assert kinds(store) == [("status", "starting"), ("status", "loading_model"), ("status", "loading_dataset"),
                            ("phase", "loading_dataset"), ("status", "training"), ("phase", "training"),
                            ("progress", None), ("progress", None), ("log", None), ("failed", None),
                            ("status", "failed")]
    with pytest.raises(IllegalTransition):
        tracker.set_status("j", S.training)  # a final status is final


def test_a_completed_worker_and_one_that_reported_its_failure(store: Store) -> None:
    tracker = Tracker(store)
    tracker.track("j", status=S.training)
    done = Completed(seq=9, output_dir="/out", metrics={"train_loss": 0.5})
    tracker.record_exit("j", Outcome("completed", "completed", done))
    row = store.get_job("j")
    assert row["status"] == "completed" and row["output_dir"] == "/out" and row["final_metrics"] == {"train_loss": 0.5}
    assert row["checkpoint"] is None
    store.insert_job({"id": "k", "status": "queued", "config": {}, "created_at": 1.0})
    tracker.track("k", status=S.training)
    tracker.on_events("k", [Failed(seq=1, message="dataset row 3 has no output")])
    tracker.record_exit("k", Outcome("failed", "dataset row 3 has no output"))
    assert [e.kind for e in Streams(store, 0.05, lambda: False).replay("k", 0, 99)] == ["failed", "status"]
