"""The seed's own client against /api/train/start: nulls mean the defaults, newer fields are ignored, out loud."""

from __future__ import annotations

from pathlib import Path

import httpx

from tunestudio.config import JobConfig
from tunestudio.jobs.manager import JobManager
from tunestudio.settings import Settings

from ..helpers import fake_workers
from ..helpers.jobs import DATA
from ..helpers.server import read_sse, running_server


def test_nulls_are_defaults_and_unknown_fields_are_ignored_with_a_warning(tmp_path: Path) -> None:
    config = Settings(home=tmp_path / "home", dataset_roots=[DATA], sse_heartbeat_seconds=0.2, prewarm=False)
    manager = JobManager(config, worker_target=fake_workers.instant)
    required = {"model_name": "org/fake", "local_datasets": [str(DATA / "alpaca.jsonl")]}
    # Every optional field as the seed's client sends it when the user left it empty: null.
    nulls = {name: None for name in JobConfig.model_fields if name not in required}
    assert {"wandb_project", "tensorboard_dir", "learning_rate", "optim"} <= set(nulls)
    newer = {"is_dataset_video": False, "trust_remote_code": True, "fp8_training": None}
    body = {**required, **nulls, "split": None, "use_lora": None, "project_root": None, **newer}
    with running_server(config, manager) as url, httpx.Client(base_url=url, timeout=30) as client:
        started = client.post("/api/train/start", json=body)
        assert started.status_code == 200, started.text
        answer = started.json()
        assert answer["status"] == "queued" and answer["error"] is None
        assert "is_dataset_video, trust_remote_code" in answer["message"]
        job = client.get(f"/api/jobs/{answer['job_id']}").json()
        defaults = JobConfig.model_validate({**required, "output_dir": job["config"]["output_dir"]}).public_dict()
        assert job["config"] == defaults  # every null became the default
        assert job["config"]["wandb_project"] and job["config"]["tensorboard_dir"]
        with client.stream("GET", f"/api/jobs/{answer['job_id']}/events") as stream:
            warnings = [e.json()["message"] for e in read_sse(stream) if e.event == "warning"]
        assert warnings == ["/api/train/start ignored fields this server does not know: is_dataset_video, "
                            "trust_remote_code"]  # fp8_training was null: nothing to ignore
        # /api/jobs stays strict.
        strict = client.post("/api/jobs", json={**required, "is_dataset_video": False})
        assert strict.status_code == 422 and "is_dataset_video" in strict.text
    manager.close()
