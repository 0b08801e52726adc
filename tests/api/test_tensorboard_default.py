"""enable_tensorboard with the default tensorboard_dir ("runs") and no output_dir: the board lands inside the job's
own output folder (jobs/ID/output/runs, in the data directory), so the API takes it, on /api/jobs and on the seed's
/api/train/start alike (both refused it: the check judged "runs" against the server's cwd)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tunestudio.api import create_app
from tunestudio.jobs.manager import JobManager
from tunestudio.settings import Settings

from ..helpers import fake_workers
from ..helpers.jobs import DATA

BASE = "http://127.0.0.1:8765"
# Relative, but out of jobs/ID/output and out of the data directory: still refused.
CLIMBING = ("../../../../../../../../tmp/board", "../../../../board")
JOB = {"model_name": "org/model", "local_datasets": [str(DATA / "alpaca.jsonl")], "enable_tensorboard": True}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    # The data directory is not the cwd (the tests run in the repository): "runs" against the cwd is outside it.
    settings = Settings(home=tmp_path / "home", dataset_roots=[DATA], model_roots=[tmp_path], prewarm=False)
    assert not Path.cwd().resolve().is_relative_to(settings.data_dir())
    manager = JobManager(settings, worker_target=fake_workers.instant)
    with TestClient(create_app(settings, manager), base_url=BASE, headers={"Origin": BASE}) as client:
        yield client
    manager.close()


def test_the_default_tensorboard_dir_is_taken_on_api_jobs(client: TestClient) -> None:
    created = client.post("/api/jobs", json=JOB)
    assert created.status_code == 201, created.text
    config = client.get(f"/api/jobs/{created.json()['id']}").json()["config"]
    assert config["tensorboard_dir"] == "runs" and config["output_dir"].endswith("/output")
    named = client.post("/api/jobs", json={**JOB, "tensorboard_dir": "boards/first"})  # any folder inside it
    assert named.status_code == 201, named.text
    for climbing in CLIMBING:
        refused = client.post("/api/jobs", json={**JOB, "tensorboard_dir": climbing})
        assert refused.status_code == 422, (climbing, refused.text)
        assert refused.json()["detail"]["field"] == "tensorboard_dir"


def test_the_default_tensorboard_dir_is_taken_on_the_seeds_start(client: TestClient) -> None:
    started = client.post("/api/train/start", json={**JOB, "tensorboard_dir": None, "output_dir": None})
    assert started.status_code == 200, started.text
    assert started.json()["status"] == "queued" and started.json()["error"] is None
    for climbing in CLIMBING:
        refused = client.post("/api/train/start", json={**JOB, "tensorboard_dir": climbing})
        assert refused.status_code == 422 and "tensorboard_dir" in refused.json()["error"], climbing
