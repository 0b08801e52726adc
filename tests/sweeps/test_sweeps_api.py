"""The sweeps API: POST /api/sweeps, GET (list, one: the leaderboard), stop, delete; a bad space is a 422."""

from __future__ import annotations

from collections.abc import Iterator
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


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(home=tmp_path / "home", dataset_roots=[DATA], prewarm=False, max_concurrent_jobs=2,
                        request_poll_seconds=0.05)
    manager = JobManager(settings, worker_target=fake_workers.sweep_trial)
    with TestClient(create_app(settings, manager), base_url=BASE, headers={"Origin": BASE}) as client:
        yield client
    manager.close()


def body(**overrides: Any) -> dict[str, Any]:
    return {"base": {"model_name": "org/model", "local_datasets": [str(DATA / "alpaca.jsonl")], "max_steps": 6,
                     "eval_steps": 2},
            "space": {"learning_rate": {"values": [1e-2, 1e-3]}, "lora_r": {"values": [4, 16]}},
            "sampler": "grid", "n_trials": 6, "objective": {"metric": "eval_loss"}, **overrides}


def test_a_sweep_through_the_api_ranks_its_trials_and_names_the_best(client: TestClient) -> None:
    created = client.post("/api/sweeps", json=body())
    assert created.status_code == 201, created.text
    sweep_id = created.json()["id"]
    wait_until(lambda: client.get(f"/api/sweeps/{sweep_id}").json()["status"] == "completed", 120, "the sweep")
    sweep = client.get(f"/api/sweeps/{sweep_id}").json()
    assert sweep["objective"] == {"metric": "eval_loss", "mode": "min"}
    assert sweep["n_trials"] == 4  # the grid has 4 points
    trials = sweep["trials"]
    assert [set(t) >= {"number", "job_id", "params", "status", "value", "best_step"} for t in trials] == [True] * 4
    values = [t["value"] for t in trials]
    assert values == sorted(values)
    expected = {(lr, r): fake_workers.sweep_objective(lr, r) + 1 / 6 for lr in (1e-2, 1e-3) for r in (4, 16)}
    assert [(t["params"]["learning_rate"], t["params"]["lora_r"]) for t in trials] == sorted(expected,
                                                                                           key=expected.get)
    assert sweep["best"] == {k: trials[0][k] for k in ("number", "job_id", "value", "params")}
    job = client.get(f"/api/jobs/{sweep['best']['job_id']}").json()
    assert job["status"] == "completed"
    assert (job["sweep_id"], job["trial"]) == (sweep_id, sweep["best"]["number"])  # the job says what it is
    assert [(j["sweep_id"], j["trial"]) for j in client.get("/api/jobs").json()["items"]
            if j["id"] == job["id"]] == [(sweep_id, sweep["best"]["number"])]
    assert [s["id"] for s in client.get("/api/sweeps").json()["items"]] == [sweep_id]
    assert client.post(f"/api/sweeps/{sweep_id}/stop", json={}).status_code == 409  # over already
    assert client.request("DELETE", f"/api/sweeps/{sweep_id}", json={}).status_code == 204
    assert client.get(f"/api/sweeps/{sweep_id}").status_code == 404
    assert client.get(f"/api/jobs/{job['id']}").status_code == 200  # its trials stay, as jobs


@pytest.mark.parametrize(("space", "named"), [
    ({"lora_rank": {"values": [4, 8]}}, "space.lora_rank"),
    ({"learning_rate": {"low": 1e-2, "high": 1e-4, "log": True}}, "space.learning_rate"),
    ({"learning_rate": {"low": -1.0, "high": 1e-2, "log": True}}, "space.learning_rate"),
    ({"max_steps": {"low": 10, "high": 5, "step": 1}}, "space.max_steps"),
    ({"target_modules": {"values": [["q_proj"], ["q_proj", "v_proj"]]}}, "space.target_modules"),
    # every value is a job, not only the first point's
    ({"lora_r": {"values": [4, -3]}}, "space.lora_r"),
    ({"lora_r": {"low": 4, "high": 8192, "step": 4}}, "space.lora_r"),  # its top, 8192, is over lora_r's bound
    ({"lora_r": {"low": 4, "high": 64, "log": True}}, "space.lora_r"),  # a float range on an integer field
    ({"model_name": {"low": 1, "high": 4}}, "space.model_name"),
])
def test_a_bad_space_is_a_422_naming_the_field(client: TestClient, space: dict, named: str) -> None:
    answer = client.post("/api/sweeps", json=body(space=space, sampler="random"))
    assert answer.status_code == 422, answer.text
    errors = answer.json()["detail"]["errors"]
    assert [e["field"] for e in errors] == [named], errors
    assert client.get("/api/sweeps").json()["items"] == []


@pytest.mark.parametrize(("overrides", "said"), [
    ({"objective": {"metric": "eval_acuracy"}}, "'eval_acuracy' is not a metric a job's evaluations measure"),
    ({"objective": {"metric": "rewards/margins"}}, "eval_rewards/margins is a metric of method dpo"),
    ({"objective": {"metric": "exact_match"}, "space": {"eval_generate_rows": {"values": [8, 0]}}},
     "with eval_generate_rows 0, exact_match is measured on held-out rows the model answers"),
    ({"objective": {"metric": "eval_loss"}, "base": {**body()["base"], "eval_steps": 0}},
     "eval_loss needs evaluations during training: set eval_steps above 0"),
])
def test_an_objective_the_trials_do_not_measure_is_a_422_naming_it(client: TestClient, overrides: dict,
                                                                    said: str) -> None:
    answer = client.post("/api/sweeps", json=body(**overrides))
    assert answer.status_code == 422, answer.text
    errors = answer.json()["detail"]["errors"]
    assert [e["field"] for e in errors] == ["objective.metric"], errors
    assert said in errors[0]["message"]


@pytest.mark.parametrize(("space", "named"), [
    ({"model_name": {"values": ["org/model", "/etc/models/llama"]}}, "space.model_name"),
    ({"eval_split": {"values": [str(DATA / "alpaca.jsonl"), "/etc/passwd.jsonl"]}}, "space.eval_split"),
    ({"held_out_rows": {"values": [None, "/etc/held_out.json"]}}, "space.held_out_rows"),
    ({"mlflow_tracking_uri": {"values": [None, "sqlite:////etc/mlflow.db"]}}, "space.mlflow_tracking_uri"),
])
def test_a_path_of_any_value_of_the_space_outside_the_roots_is_a_422(client: TestClient, space: dict,
                                                                      named: str) -> None:
    """Not only the first point's: a later value of a path field is confined as its own trial would be."""
    fields = {k: v for k, v in body()["base"].items() if k not in space}
    if "mlflow_tracking_uri" in space:
        fields["report_to"] = ["mlflow"]
    answer = client.post("/api/sweeps", json=body(base=fields, space=space, sampler="grid"))
    assert answer.status_code == 422, answer.text
    errors = answer.json()["detail"]["errors"]
    assert [e["field"] for e in errors] == [named], errors
    refused = space[named.removeprefix("space.")]["values"][1]
    assert errors[0]["message"].startswith(f"the value {refused!r}: "), errors
    assert client.get("/api/sweeps").json()["items"] == []


def test_an_output_dir_value_outside_the_roots_is_a_422(client: TestClient, tmp_path: Path) -> None:
    inside = tmp_path / "home" / "runs" / "a"
    answer = client.post("/api/sweeps", json=body(space={"output_dir": {"values": [str(inside), "/tmp/elsewhere"]}}))
    assert answer.status_code == 422, answer.text
    errors = answer.json()["detail"]["errors"]
    assert [e["field"] for e in errors] == ["space.output_dir"]
    assert errors[0]["message"].startswith("the value '/tmp/elsewhere': /tmp/elsewhere must be a folder strictly "
                                           f"inside one of {tmp_path / 'home'}, {DATA}")


def test_a_stopped_sweep_starts_no_more_trials_and_its_running_ones_stop_with_a_save(client: TestClient) -> None:
    created = client.post("/api/sweeps", json=body(parallel=1, base={**body()["base"], "max_steps": 400}))
    assert created.status_code == 201, created.text
    sweep_id = created.json()["id"]
    wait_until(lambda: [t["status"] for t in client.get(f"/api/sweeps/{sweep_id}").json()["trials"]] == ["training"],
               60, "the first trial to run")
    assert client.request("DELETE", f"/api/sweeps/{sweep_id}", json={}).status_code == 409  # live
    assert client.post(f"/api/sweeps/{sweep_id}/stop", json={}).json()["status"] == "stopping"
    wait_until(lambda: client.get(f"/api/sweeps/{sweep_id}").json()["status"] == "stopped", 60, "the sweep to stop")
    trials = client.get(f"/api/sweeps/{sweep_id}").json()["trials"]
    assert len(trials) == 1
    assert client.get(f"/api/jobs/{trials[0]['job_id']}").json()["status"] == "stopped"
    assert client.get("/api/sweeps/sw-nothere").status_code == 404
