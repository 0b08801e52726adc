"""Processes on one data directory: ownership, stop requests, the shared FIFO, orphans."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tunestudio.jobs.models import Job, JobConflict
from tunestudio.jobs.owners import Owners
from tunestudio.jobs.store import Store


def test_owners(tmp_path: Path) -> None:
    store = Store(tmp_path / "db.sqlite")
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        owners = Owners(store, poll_seconds=0.05)
        rows = {"mine": (owners.me, "training", 3.0), "theirs": (other.pid, "queued", 1.0),
                "dead": (999_999_999, "training", 2.0), "done": (999_999_999, "completed", 0.5)}
        for job_id, (pid, status, created) in rows.items():
            store.insert_job({"id": job_id, "status": status, "config": {}, "created_at": created, "owner_pid": pid})
        assert owners.owned_elsewhere(store.get_job("theirs")) and not owners.owned_elsewhere(store.get_job("mine"))
        assert [r["id"] for r in owners.orphans()] == ["dead", "mine"]  # oldest first; not theirs, not done
        assert owners.older_job_waits_elsewhere("mine")  # "theirs" was queued earlier by a live process
        store.update_job("mine", wait=True, stop_request="cancel")
        assert list(owners.requests()) == [("mine", False)]
        assert list(owners.requests()) == []  # taken once
        with pytest.raises(JobConflict, match="is gone"):
            owners.ask("dead", True, lambda j: Job.from_row(store.get_job(j)))
        owners_elsewhere = Owners(store, poll_seconds=0.05)
        owners_elsewhere.me = other.pid  # as if from the other process: its own job is not "elsewhere"
        assert list(owners_elsewhere.requests()) == []
    finally:
        other.kill()
        other.wait(5)
        store.close()
