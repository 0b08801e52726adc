"""A sweep's secrets (hf_token, wandb_token) are kept in memory only: never in its study file nor any response, yet
every trial's worker gets them; a restarted server says the sweep must be given them again, and takes them."""

from __future__ import annotations

import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tunestudio.api import create_app
from tunestudio.jobs.manager import JobManager
from tunestudio.settings import Settings

from ..helpers import fake_workers
from ..helpers.jobs import DATA
from ..helpers.wait import wait_until

BASE = "http://127.0.0.1:8765"
HF, WANDB = f"hf_{secrets.token_hex(12)}", f"wandb-{secrets.token_hex(12)}"


@contextmanager
def server(home: Path) -> Iterator[tuple[TestClient, JobManager]]:
    settings = Settings(home=home, dataset_roots=[DATA], prewarm=False, max_concurrent_jobs=1,
                        request_poll_seconds=0.05)
    manager = JobManager(settings, worker_target=fake_workers.sweep_trial)
    try:
        with TestClient(create_app(settings, manager), base_url=BASE, headers={"Origin": BASE}) as client:
            yield client, manager
    finally:
        manager.close()


def body(max_steps: int = 2, **secret_fields: str) -> dict[str, Any]:
    return {"base": {"model_name": "org/model", "local_datasets": [str(DATA / "alpaca.jsonl")], "max_steps": max_steps,
                     "eval_steps": 1, **secret_fields},
            "space": {"lora_r": {"values": [4, 16]}}, "sampler": "grid", "n_trials": 2, "parallel": 1}


def leaks(home: Path) -> list[str]:
    """Every file under the data directory whose bytes hold a secret (the study, the job store, its WAL, logs)."""
    return [str(p) for p in home.rglob("*")
            if p.is_file() and any(s.encode() in p.read_bytes() for s in (HF, WANDB))]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_secrets_in_the_base_stay_in_memory_out_of_every_answer_and_reach_each_trial(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with server(home) as (client, manager):
        created = client.post("/api/sweeps", json=body(hf_token=HF, wandb_token=WANDB))
        assert created.status_code == 201, created.text
        sweep_id = created.json()["id"]
        wait_until(lambda: client.get(f"/api/sweeps/{sweep_id}").json()["status"] == "completed", 60, "the sweep")
        answers = [created, client.get("/api/sweeps"), client.get(f"/api/sweeps/{sweep_id}")]
        assert [HF in a.text or WANDB in a.text for a in answers] == [False] * 3
        sweep = answers[2].json()
        assert sweep["secrets"] == ["hf_token", "wandb_token"]  # which it holds, by name only
        assert not {"hf_token", "wandb_token"} & set(sweep["config"]["base"])
        assert len(sweep["trials"]) == 2
        for trial in sweep["trials"]:  # each trial's worker was handed the real secrets, not a mask of them
            assert trial["status"] == "completed", trial
            job = manager.get(trial["job_id"])
            assert fake_workers.seen_secrets(job.output_dir) == {"hf_token": fake_workers.secret_hash(HF),
                                                                 "wandb_token": fake_workers.secret_hash(WANDB)}
    assert leaks(home) == []
    study = home / "sweeps" / f"{sweep_id}.db"
    # Owner-only: the data directory the studio made, its sweeps folder, the sweep's study and the job store.
    assert [mode(p) for p in (home, home / "sweeps", study, home / "tunestudio.db")] == [0o700, 0o700, 0o600, 0o600]


@pytest.mark.parametrize("field", ["hf_token", "wandb_token"])
def test_a_secret_in_the_space_is_a_422_naming_it(tmp_path: Path, field: str) -> None:
    with server(tmp_path / "home") as (client, _):
        answer = client.post("/api/sweeps", json={**body(), "space": {field: {"values": [HF, WANDB]}}})
        assert answer.status_code == 422, answer.text
        errors = answer.json()["detail"]["errors"]
        assert [e["field"] for e in errors] == [f"space.{field}"]
        assert "secret" in errors[0]["message"] and HF not in answer.text
        assert client.get("/api/sweeps").json()["items"] == []


def test_a_restarted_server_asks_for_the_secret_again_and_the_resumed_sweep_hands_it_on(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with server(home) as (client, manager):
        sweep_id = client.post("/api/sweeps", json=body(max_steps=400, hf_token=HF)).json()["id"]
        first = wait_until(lambda: next((t["job_id"] for t in client.get(f"/api/sweeps/{sweep_id}").json()["trials"]
                                         if t["status"] == "training"), None), 60, "the first trial to run")
    # The server went down mid-trial (its job stopped with a save): the secret went with its memory.
    with server(home) as (client, manager):
        sweep = client.get(f"/api/sweeps/{sweep_id}").json()
        assert (sweep["status"], sweep["secrets"], sweep["secrets_missing"]) == ("needs_secrets", ["hf_token"],
                                                                                 ["hf_token"])
        assert "hf_token" in sweep["error"] and f"/api/sweeps/{sweep_id}/resume" in sweep["error"]
        assert [j.id for j in manager.list(sweep_id=sweep_id)] == [first]  # nothing ran without it
        refused = client.post(f"/api/sweeps/{sweep_id}/resume", json={})
        assert refused.status_code == 422, refused.text
        assert [e["field"] for e in refused.json()["detail"]["errors"]] == ["hf_token"]
        unknown = client.post(f"/api/sweeps/{sweep_id}/resume", json={"hf_token": HF, "wandb_token": WANDB})
        assert unknown.status_code == 422, unknown.text  # a secret its base never set
        assert [e["field"] for e in unknown.json()["detail"]["errors"]] == ["wandb_token"]
        resumed = client.post(f"/api/sweeps/{sweep_id}/resume", json={"hf_token": HF})
        assert resumed.status_code == 200, resumed.text
        assert (resumed.json()["status"], resumed.json()["secrets_missing"]) == ("running", [])
        again = wait_until(lambda: next((j for j in manager.list(sweep_id=sweep_id)
                                         if j.id != first and j.output_dir
                                         and (Path(j.output_dir) / fake_workers.SECRETS_SEEN).is_file()), None),
                           60, "the trial to run again")
        assert fake_workers.seen_secrets(again.output_dir) == {"hf_token": fake_workers.secret_hash(HF)}
        assert client.post(f"/api/sweeps/{sweep_id}/resume", json={"hf_token": HF}).status_code == 409  # has it
        client.post(f"/api/sweeps/{sweep_id}/stop", json={})
        wait_until(lambda: client.get(f"/api/sweeps/{sweep_id}").json()["status"] == "stopped", 60, "the stop")
    assert leaks(home) == []
