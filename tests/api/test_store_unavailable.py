"""A job that ends while another process holds the database's write lock: its stream still ends, nothing is lost."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import httpx

from tunestudio.jobs.manager import JobManager
from tunestudio.settings import Settings

from ..helpers import fake_workers
from ..helpers.jobs import DATA
from ..helpers.server import read_sse, running_server
from ..helpers.wait import wait_until


def test_the_stream_ends_with_the_final_status_while_the_database_is_locked(tmp_path: Path) -> None:
    config = Settings(home=tmp_path / "home", dataset_roots=[DATA], sse_heartbeat_seconds=0.2, prewarm=False)
    manager = JobManager(config, worker_target=fake_workers.waits_for_go)
    out = tmp_path / "home" / "out"
    body = {"model_name": "org/fake", "local_datasets": [str(DATA / "alpaca.jsonl")], "output_dir": str(out)}
    db = tmp_path / "home" / "tunestudio.db"
    with running_server(config, manager) as url, httpx.Client(base_url=url, timeout=30) as client:
        job_id = client.post("/api/jobs", json=body).json()["id"]
        wait_until(lambda: client.get(f"/api/jobs/{job_id}").json()["status"] == "training", 30, "training")
        seen: list = []

        def follow() -> None:
            with httpx.Client(base_url=url, timeout=60) as reader, \
                    reader.stream("GET", f"/api/jobs/{job_id}/events") as response:
                seen.extend(e for e in read_sse(response) if e.event != "heartbeat")

        reader = threading.Thread(target=follow)
        reader.start()
        wait_until(lambda: any(e.event == "progress" for e in seen), 30, "the stream to be live")

        other = sqlite3.connect(db, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # e.g. a backup tool holding the write lock for a long time
        try:
            (out / "go").touch()  # the worker completes now
            reader.join(30)
            assert not reader.is_alive(), "the stream did not end"
            assert seen[-1].event == "status" and seen[-1].json()["status"] == "completed"
            # The final status is kept in memory, so the API tells the truth meanwhile ...
            assert client.get(f"/api/jobs/{job_id}").json()["status"] == "completed"
            # ... and a caller whose write cannot be made hears so while the lock is still held (a request that
            # waited for the lock would end in a timeout, not in this answer), in the API's error shape.
            refused = client.post("/api/jobs", json={**body, "output_dir": str(tmp_path / "home" / "out2")})
            assert other.in_transaction
            assert refused.status_code == 503 and refused.json()["detail"]["code"] == "store_unavailable"
            assert "locked" in refused.json()["detail"]["message"]
        finally:
            other.execute("ROLLBACK")
            other.close()

        def status_on_disk() -> str | None:
            conn = sqlite3.connect(db)
            try:
                return conn.execute("SELECT status FROM jobs WHERE id = ?", (job_id,)).fetchone()[0]
            finally:
                conn.close()

        wait_until(lambda: status_on_disk() == "completed", 15, "the final status on disk")
        assert client.get("/api/jobs").json()["total"] == 1  # the refused job was not created later
    manager.close()
