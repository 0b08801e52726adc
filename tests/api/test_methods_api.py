"""Training methods over the HTTP API: their validation, their reward files, and their metrics' way to a client."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path
from typing import Any

import httpx

from tunestudio.jobs.manager import JobManager
from tunestudio.jobs.store import Store
from tunestudio.settings import Settings
from tunestudio.worker.child import WorkerArgs

from ..helpers.jobs import DATA
from ..helpers.server import read_sse, running_server


def dpo_metrics(args: WorkerArgs) -> None:
    """A scripted DPO worker: three steps with the method's metrics in `extra`, then an eval record."""
    from tunestudio.events import Completed, Phase, Progress
    from tunestudio.worker.channel import QueueChannel

    from ..helpers import fake_workers

    fake_workers._setup(args)
    channel = QueueChannel(args.events, args.commands)
    channel.emit(Phase, phase="training")
    for step in (1, 2, 3):
        channel.emit(Progress, step=step, total_steps=3, loss=0.7 - step / 100,
                     extra={"rewards/margins": step / 10, "rewards/accuracies": 1.0, "logps/chosen": -5.0})
    channel.emit(Progress, step=3, total_steps=3, eval_loss=0.6, extra={"eval_rewards/margins": 0.25})
    channel.emit(Completed, output_dir=None, stopped=False, saved=True, global_step=3)
    channel.close()
    sys.exit(0)


def settings(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path / "home", dataset_roots=[DATA, tmp_path / "allowed"], sse_heartbeat_seconds=0.3)


def job(tmp_path: Path, **fields: Any) -> dict[str, Any]:
    return {"model_name": "tiny", "local_datasets": [str(DATA / "prompts.jsonl")], **fields}


def test_method_metrics_reach_the_metrics_route_the_stream_and_the_job(tmp_path: Path) -> None:
    manager = JobManager(settings(tmp_path), worker_target=dpo_metrics)
    with running_server(settings(tmp_path), manager) as url, httpx.Client(base_url=url, timeout=30) as client:
        created = client.post("/api/jobs", json=job(tmp_path, method="dpo",
                                                    local_datasets=[str(DATA / "preference.jsonl")]))
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
        with client.stream("GET", f"/api/jobs/{job_id}/events", timeout=60) as response:
            progress = [e.json() for e in read_sse(response) if e.event == "progress"]
        assert [p["extra"]["rewards/margins"] for p in progress[:3]] == [0.1, 0.2, 0.3]
        records = client.get(f"/api/jobs/{job_id}/metrics").json()["records"]
        assert [r["extra"] for r in records] == [p["extra"] for p in progress]  # stored per step, as sent
        assert records[-1]["extra"] == {"eval_rewards/margins": 0.25} and records[-1]["eval_loss"] == 0.6
        charted = client.get(f"/api/jobs/{job_id}/metrics", params={"max_points": 2}).json()["records"]
        assert all(r["extra"] for r in charted)
        assert client.get(f"/api/jobs/{job_id}").json()["config"]["method"] == "dpo"
        # A replay after the job ended rebuilds the same progress events from the store.
        with client.stream("GET", f"/api/jobs/{job_id}/events", timeout=60) as response:
            replayed = [e.json() for e in read_sse(response) if e.event == "progress"]
        assert replayed == progress


def test_an_option_of_another_method_is_refused_naming_both(tmp_path: Path) -> None:
    with running_server(settings(tmp_path)) as url, httpx.Client(base_url=url, timeout=30) as client:
        response = client.post("/api/jobs", json=job(tmp_path, method="dpo", num_generations=8))
        assert response.status_code == 422
        detail = response.json()["detail"]
        assert "num_generations" in detail["message"] and "'dpo'" in detail["message"]
        assert "grpo" in detail["message"] and "Traceback" not in response.text


def test_a_reward_function_file_outside_the_reward_folders_is_refused(tmp_path: Path) -> None:
    code = "def score(completions, **kw):\n    return [0.0] * len(completions)\n"
    rewards = tmp_path / "home" / "rewards"  # the default reward folder: the data directory's rewards/
    rewards.mkdir(parents=True)
    (rewards / "ok.py").write_text(code)
    allowed = tmp_path / "allowed"  # a dataset folder: data may be read there, code is not run from it
    allowed.mkdir()
    (allowed / "data.py").write_text(code)
    outside = tmp_path / "elsewhere.py"
    outside.write_text(code)
    grpo = {"method": "grpo", "batch_size": 4, "gradient_accumulation_steps": 1}
    with running_server(settings(tmp_path)) as url, httpx.Client(base_url=url, timeout=30) as client:
        for path in (outside, allowed / "data.py"):
            refused = client.post("/api/jobs", json=job(tmp_path, **grpo, reward_functions=[f"{path}:score"]))
            assert refused.status_code == 422 and "outside the allowed reward function folders" in refused.text
            assert refused.json()["detail"]["code"] == "path_not_allowed"
        accepted = client.post("/api/jobs", json=job(tmp_path, **grpo,
                                                     reward_functions=["exact_match", f"{rewards / 'ok.py'}:score"]))
        assert accepted.status_code == 201, accepted.text
        client.post(f"/api/jobs/{accepted.json()['id']}/cancel")
    chosen = Settings(home=tmp_path / "home", dataset_roots=[DATA], reward_roots=[allowed])
    with running_server(chosen) as url, httpx.Client(base_url=url, timeout=30) as client:
        accepted = client.post("/api/jobs", json=job(tmp_path, **grpo,
                                                     reward_functions=[f"{allowed / 'data.py'}:score"]))
        assert accepted.status_code == 201, accepted.text
        client.post(f"/api/jobs/{accepted.json()['id']}/cancel")


def test_the_preview_reads_a_methods_format(tmp_path: Path) -> None:
    with running_server(settings(tmp_path)) as url, httpx.Client(base_url=url, timeout=120) as client:
        answer = client.post("/api/web/preview", json={"local_datasets": [str(DATA / "preference.jsonl")],
                                                        "method": "dpo", "rows": 2}).json()
        assert answer["format"] == "preference" and answer["detected"] is True
        assert set(answer["rows"][0]["converted"]) == {"prompt", "chosen", "rejected"}
        defaults = client.get("/api/web/defaults").json()
        fields = {f["name"]: f for f in defaults["fields"]}
        assert fields["num_generations"]["methods"] == ["grpo"] and fields["learning_rate"]["methods"] is None
        assert defaults["method_formats"]["kto"] == ["unpaired", "preference"]


def test_an_older_store_gains_the_extra_column_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:  # the metrics table as it was before methods had metrics of their own
        conn.execute("CREATE TABLE metrics (job_id TEXT NOT NULL, seq INTEGER, step INTEGER NOT NULL, "
                     "total_steps INTEGER, epoch REAL, loss REAL, learning_rate REAL, grad_norm REAL, eval_loss REAL, "
                     "num_tokens INTEGER, tokens_per_second REAL, elapsed_seconds REAL, eta_seconds REAL, ts REAL)")
        conn.execute("INSERT INTO metrics (job_id, seq, step, loss) VALUES ('j', 1, 1, 0.5)")
    store = Store(path)
    try:
        store.append("j", metrics=[(2, {"step": 2, "loss": 0.4, "extra": {"reward": 0.5}})])
        store.flush()
        assert [(r["step"], r["extra"]) for r in store.metrics("j")] == [(1, None), (2, {"reward": 0.5})]
    finally:
        store.close()
