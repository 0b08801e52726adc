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


def test_a_database_that_cannot_be_read_is_a_503_or_an_error_event_never_an_empty_200(tmp_path) -> None:
    import sqlite3

    import httpx

    from tunestudio.jobs.manager import JobManager
    from tunestudio.settings import Settings

    from ..helpers import fake_workers
    from ..helpers.jobs import DATA
    from ..helpers.server import read_sse, running_server
    from ..helpers.wait import wait_until

    config = Settings(home=tmp_path / "home", dataset_roots=[DATA, tmp_path], sse_heartbeat_seconds=0.2)
    manager = JobManager(config, worker_target=fake_workers.writes_output)
    body = {"model_name": "org/fake", "local_datasets": [str(DATA / "alpaca.jsonl")], "output_dir": str(tmp_path / "o")}
    real = manager.subscribe
    with running_server(config, manager) as url, httpx.Client(base_url=url, timeout=30) as client:
        job_id = client.post("/api/jobs", json=body).json()["id"]
        wait_until(lambda: client.get(f"/api/jobs/{job_id}").json()["status"] == "completed", 30, "the job")

        def full(*args, **kwargs):
            raise sqlite3.OperationalError("database or disk is full")

        manager.subscribe = full
        refused = client.get(f"/api/jobs/{job_id}/events")
        assert refused.status_code == 503 and refused.json()["detail"]["code"] == "store_unavailable"
        assert "disk is full" in refused.json()["detail"]["message"] and "Traceback" not in refused.text

        def fails_after_one(*args, **kwargs):
            sub = real(*args, **kwargs)
            stored = sub.replay

            def replay():
                yield next(stored)
                raise sqlite3.OperationalError("disk I/O error")

            sub.replay = replay()
            return sub

        manager.subscribe = fails_after_one
        with client.stream("GET", f"/api/jobs/{job_id}/events") as response:
            assert response.status_code == 200
            events = list(read_sse(response))
        assert [e.event for e in events] == ["status", "error"]
        assert "disk I/O error" in events[-1].json()["message"]
    manager.close()
