"""The HTTP API over a real server, real SQLite, real (or scripted) workers."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tunestudio.jobs.manager import JobManager
from tunestudio.settings import Settings

from ..helpers import fake_workers
from ..helpers.jobs import DATA, job_config
from ..helpers.server import read_sse, running_server
from ..helpers.wait import wait_until

REPO = Path(__file__).resolve().parents[2]
JSON = {"Content-Type": "application/json"}  # every state-changing request must say it is JSON


def settings(tmp_path: Path, **overrides: object) -> Settings:
    return Settings(home=tmp_path / "home", dataset_roots=[DATA, tmp_path], sse_heartbeat_seconds=0.3,
                    **overrides)


_outputs = itertools.count()


def body(model: Path | str, tmp_path: Path, **overrides: object) -> dict:
    """A job request with an output folder of its own (two live jobs never share one)."""
    cfg = job_config(model, tmp_path / "home" / f"out-{next(_outputs)}", **overrides).public_dict()
    return {k: v for k, v in cfg.items() if v is not None}


def follow(client: httpx.Client, job_id: str, after: int | None = None, stop_after: int | None = None) -> list:
    headers = {"Last-Event-ID": str(after)} if after is not None else {}
    got = []
    with client.stream("GET", f"/api/jobs/{job_id}/events", headers=headers, timeout=120) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for event in read_sse(response):
            got.append(event)
            if stop_after is not None and sum(e.event == "progress" for e in got) >= stop_after:
                break
    return got


def test_job_over_http_and_sse_to_completion(tiny_model: Path, tmp_path: Path) -> None:
    with running_server(settings(tmp_path)) as url, httpx.Client(base_url=url, timeout=30) as client:
        created = client.post("/api/jobs", json=body(tiny_model, tmp_path, max_steps=12, hf_token="hf_ZZSECRETZZ"))
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
        events = follow(client, job_id)
        assert events[0].retry is not None
        named = [e for e in events if e.event != "heartbeat"]
        seqs = [int(e.id) for e in named]
        assert seqs == list(range(1, len(seqs) + 1))
        steps = [e.json()["step"] for e in named if e.event == "progress" and e.json()["loss"] is not None]
        assert steps == list(range(1, 13))  # every step once, in order
        assert {"status", "phase", "progress", "log", "completed"} <= {e.event for e in named}
        assert named[-1].event == "status" and named[-1].json()["status"] == "completed"
        job = client.get(f"/api/jobs/{job_id}").json()
        assert job["status"] == "completed" and job["resumable"] is False
        assert {"adapter_model.safetensors", "metrics.jsonl"} <= {a["name"] for a in job["artefacts"]}
        assert job["progress"]["step"] == 12 and "hf_token" not in job["config"]
        metrics = client.get(f"/api/jobs/{job_id}/metrics", params={"max_points": 5}).json()["records"]
        assert len(metrics) <= 5 and metrics[0]["step"] == 1 and metrics[-1]["step"] == 12
        since = client.get(f"/api/jobs/{job_id}/metrics", params={"since_step": 10}).json()["records"]
        assert [r["step"] for r in since] == [11, 12]
        listing = client.get("/api/jobs", params={"status": "completed"}).json()
        assert listing["total"] == 1 and listing["items"][0]["id"] == job_id
        for theme in ("light", "dark"):
            png = client.get(f"/api/jobs/{job_id}/plot.png", params={"theme": theme})
            assert png.status_code == 200 and png.content[:8] == b"\x89PNG\r\n\x1a\n"
        # No response in the job's life carried the secret.
        everything = json.dumps([e.data for e in events]) + client.get(f"/api/jobs/{job_id}").text
        everything += client.get("/api/jobs").text + client.get(f"/api/jobs/{job_id}/metrics").text
        everything += client.get("/api/train/status").text
        assert "ZZSECRETZZ" not in everything


def test_reconnect_with_last_event_id_gets_exactly_the_missed_events(tmp_path: Path) -> None:
    # the worker ignores stops and SIGTERM: short graces end it at the cancel in a second, not in 35 s
    manager = JobManager(settings(tmp_path, stop_grace_seconds=0.5, kill_after_seconds=0.5),
                         worker_target=fake_workers.ignores_stop)
    with running_server(settings(tmp_path), manager) as url, httpx.Client(base_url=url, timeout=30) as client:
        job_id = client.post("/api/jobs", json=body("org/fake", tmp_path)).json()["id"]
        first = follow(client, job_id, stop_after=5)  # the client drops the connection here
        last = int([e for e in first if e.id][-1].id)
        # Events happen while nobody listens: wait until the job has gone on by a few.
        wait_until(lambda: client.get(f"/api/jobs/{job_id}").json()["last_seq"] > last + 5, 30, "more events")
        second = follow(client, job_id, after=last, stop_after=10)
        ids = [int(e.id) for e in second if e.id]
        assert ids[0] == last + 1 and ids == list(range(last + 1, last + 1 + len(ids)))
        client.post(f"/api/jobs/{job_id}/cancel", json={})
    manager.close()


def test_two_jobs_streams_never_mix(tmp_path: Path) -> None:
    manager = JobManager(settings(tmp_path, max_concurrent_jobs=2), worker_target=fake_workers.flood)
    with running_server(settings(tmp_path), manager) as url, httpx.Client(base_url=url, timeout=30) as client:
        a = client.post("/api/jobs", json=body("org/fake", tmp_path, max_steps=300)).json()["id"]
        b = client.post("/api/jobs", json=body("org/fake", tmp_path, max_steps=77)).json()["id"]
        for job_id, total in ((a, 300), (b, 77)):
            progress = [e.json() for e in follow(client, job_id) if e.event == "progress"]
            assert [p["step"] for p in progress] == list(range(1, total + 1))
            assert {p["total_steps"] for p in progress} == {total}
    manager.close()


def test_bad_input_is_refused_with_field_errors_and_nothing_starts(tmp_path: Path) -> None:
    outside = tmp_path.parent / f"{tmp_path.name}-outside.jsonl"
    outside.write_text('{"instruction": "a", "output": "b"}\n')
    (tmp_path / "escape.jsonl").symlink_to(outside)
    with running_server(settings(tmp_path)) as url, httpx.Client(base_url=url, timeout=30) as client:
        bad = client.post("/api/jobs", json={**body("org/m", tmp_path), "batch_size": 0, "learning_rate": "abc"})
        assert bad.status_code == 422
        fields = {e["field"] for e in bad.json()["detail"]["errors"]}
        assert fields == {"batch_size", "learning_rate"}
        assert "Traceback" not in bad.text
        # An unknown field names the closest the config has, nested parts too (issue 38, finding 14).
        typo = client.post("/api/jobs", json={**body("org/m", tmp_path), "learning_rat": 1e-4,
                                              "early_stopping": {"patiense": 2}})
        assert typo.status_code == 422
        said = {e["field"]: e["message"] for e in typo.json()["detail"]["errors"]}
        assert "did you mean `learning_rate`?" in said["learning_rat"], said
        assert "did you mean `patience`?" in said["early_stopping.patiense"], said
        assert "did you mean `learning_rate`?" in typo.json()["detail"]["message"]
        for path in (str(outside), str(tmp_path / "escape.jsonl"), str(tmp_path / ".." / outside.name)):
            refused = client.post("/api/jobs", json={**body("org/m", tmp_path), "local_datasets": [path]})
            assert refused.status_code == 422, path
            assert refused.json()["detail"]["code"] == "path_not_allowed"
        nobody = "~no-such-user-here"
        for field, value in (("model_name", f"{nobody}/m"), ("local_datasets", [f"{nobody}/d.jsonl"])):
            tilde = client.post("/api/jobs", json={**body("org/m", tmp_path), field: value})  # pathlib: RuntimeError
            assert tilde.status_code == 422 and tilde.json()["detail"]["field"] == field, tilde.text
        for where in (tmp_path.parent / "elsewhere", tmp_path, tmp_path / "home", tmp_path / "home" / "jobs" / "x"):
            out = client.post("/api/jobs", json={**body("org/m", tmp_path), "output_dir": str(where)})
            assert out.status_code == 422 and out.json()["detail"]["field"] == "output_dir", where
        for field, value in (("max_steps", 1e300), ("learning_rate", float("nan")), ("num_epochs", float("inf")),
                             ("eval_steps", float("-inf")), ("save_steps", 2**70), ("lora_r", 10**9)):
            overflow = client.post("/api/jobs", content=json.dumps({**body("org/m", tmp_path), field: value}),
                                   headers={"content-type": "application/json"})
            assert overflow.status_code == 422, (field, overflow.text)
            assert overflow.json()["detail"]["errors"][0]["field"] == field
        for field, value in (("model_name", "/opt/models/m"), ("eval_split", "/etc/val.jsonl"),
                             ("resume_from_checkpoint", "/var/ckpt")):
            confined = client.post("/api/jobs", json={**body("org/m", tmp_path), field: value})
            assert confined.status_code == 422 and confined.json()["detail"]["field"] == field, field
        huge = client.post("/api/jobs", content=b"{" + b" " * 2_000_000 + b"}",
                           headers={"content-type": "application/json"})
        assert huge.status_code == 413 and huge.json()["detail"]["code"] == "too_large"
        assert client.get("/api/jobs/nope").json() == {"detail": {"code": "not_found", "message": "no job 'nope'"}}
        assert client.get("/api/jobs").json()["total"] == 0
        # Integers past SQLite's range are a 422 on the field (schemathesis found a 500 here), not an error.
        for query in ("offset=821642945827745243439344648192", "offset=9223372036854775808"):
            too_big = client.get(f"/api/jobs?{query}")
            assert too_big.status_code == 422 and too_big.json()["detail"]["errors"][0]["field"] == "query.offset"
        assert client.get("/api/jobs?offset=9223372036854775807").json()["items"] == []
        empty = client.get("/api/jobs/nope/plot.png")
        assert empty.status_code == 404


def test_plot_has_an_empty_state_and_delete_rules(tmp_path: Path) -> None:
    quick = settings(tmp_path, stop_grace_seconds=0.5, kill_after_seconds=0.5)
    manager = JobManager(quick, worker_target=fake_workers.ignores_stop)
    with running_server(quick, manager) as url, httpx.Client(base_url=url, timeout=30) as client:
        job_id = client.post("/api/jobs", json=body("org/fake", tmp_path)).json()["id"]
        queued = client.post("/api/jobs", json=body("org/fake", tmp_path)).json()["id"]
        empty = client.get(f"/api/jobs/{queued}/plot.png", params={"theme": "dark"})
        assert empty.status_code == 200 and empty.content[:4] == b"\x89PNG"
        assert client.get(f"/api/jobs/{queued}/plot.png", params={"theme": "sepia"}).status_code == 422
        assert client.delete(f"/api/jobs/{job_id}", headers=JSON).status_code == 409  # live
        assert client.post(f"/api/jobs/{queued}/cancel", json={}).json()["status"] == "cancelled"
        client.post(f"/api/jobs/{job_id}/cancel", json={})
        wait_until(lambda: client.get(f"/api/jobs/{job_id}").json()["status"] == "cancelled", 30, "the cancel")
        job_dir = tmp_path / "home" / "jobs" / job_id
        assert job_dir.exists()
        assert client.delete(f"/api/jobs/{job_id}", params={"delete_artifacts": True}, headers=JSON).status_code == 204
        assert not job_dir.exists() and client.get(f"/api/jobs/{job_id}").status_code == 404
    manager.close()


def test_token_is_required_off_loopback(tmp_path: Path) -> None:
    env = {**os.environ, "TUNESTUDIO_HOME": str(tmp_path / "home")}
    env.pop("TUNESTUDIO_API_TOKEN", None)
    refused = subprocess.run([sys.executable, "-m", "tunestudio.cli", "serve", "--host", "0.0.0.0"],
                             capture_output=True, text=True, env=env, timeout=60)
    assert refused.returncode == 2 and "TUNESTUDIO_API_TOKEN" in refused.stderr
    guarded = settings(tmp_path, api_token="s3cret-token")
    with running_server(guarded) as url, httpx.Client(base_url=url, timeout=30) as client:
        assert client.get("/healthz").status_code == 200
        for path in ("/api/jobs", "/api/train/status", "/api/system/hardware"):
            assert client.get(path).status_code == 401
            assert client.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
            assert client.get(path, headers={"Authorization": "Bearer s3cret-token"}).status_code == 200


def test_seed_train_surface_round_trip(tiny_model: Path, tmp_path: Path) -> None:
    seed_request = {
        "model_name": str(tiny_model), "training_type": "LoRA/QLoRA", "load_in_4bit": False, "hf_token": "",
        "max_seq_length": 128, "hf_dataset": "", "local_datasets": [str(DATA / "alpaca.jsonl")], "format_type": "",
        "subset": None, "split": "train", "eval_split": None, "eval_steps": 0.5, "dataset_slice_start": None,
        "dataset_slice_end": None, "custom_format_mapping": None, "num_epochs": 1, "learning_rate": "3e-3",
        "batch_size": 8, "gradient_accumulation_steps": 1, "warmup_steps": None, "warmup_ratio": None,
        "max_steps": 10, "save_steps": 0, "weight_decay": 0.01, "random_seed": 3407, "packing": False,
        "optim": "adamw_8bit", "lr_scheduler_type": "linear", "use_lora": True, "lora_r": 8, "lora_alpha": 16,
        "lora_dropout": 0.0, "target_modules": None, "gradient_checkpointing": "unsloth", "use_rslora": False,
        "use_loftq": False, "train_on_completions": True, "is_dataset_image": False, "is_dataset_audio": False,
        "finetune_vision_layers": True, "finetune_language_layers": True, "finetune_attention_modules": True,
        "finetune_mlp_modules": True, "enable_wandb": False, "wandb_token": None, "wandb_project": "x",
        "enable_tensorboard": False, "tensorboard_dir": "runs", "output_dir": str(tmp_path / "home" / "seed-out"),
    }
    with running_server(settings(tmp_path)) as url, httpx.Client(base_url=url, timeout=30) as client:
        idle = client.get("/api/train/status").json()
        assert idle["phase"] == "idle" and idle["job_id"] is None
        bad = client.post("/api/train/start", json={**seed_request, "batch_size": 0})
        assert bad.status_code == 422 and bad.json()["status"] == "error" and "batch_size" in bad.json()["error"]
        started = client.post("/api/train/start", json=seed_request).json()
        assert set(started) == {"job_id", "status", "message", "error"} and started["status"] == "queued"
        job_id = started["job_id"]
        assert client.get(f"/api/jobs/{job_id}").status_code == 200
        with client.stream("GET", "/api/train/progress", timeout=120) as response:
            kinds = []
            for event in read_sse(response):
                kinds.append(event.event)
                if event.event == "progress":
                    assert event.id == str(event.json()["step"])
            assert kinds[-1] == "complete" and "progress" in kinds
        status = client.get("/api/train/status").json()
        assert set(status) == {"job_id", "phase", "is_training_running", "eval_enabled", "message", "error",
                               "details", "metric_history"}
        assert status["job_id"] == job_id and status["phase"] == "completed" and not status["is_training_running"]
        assert status["eval_enabled"] is True
        assert set(status["details"]) == {"epoch", "step", "total_steps", "loss", "learning_rate"}
        assert status["details"]["step"] == 10 and status["details"]["total_steps"] == 10
        history = status["metric_history"]
        assert set(history) == {"steps", "loss", "lr", "grad_norm", "grad_norm_steps", "eval_loss", "eval_steps"}
        assert history["steps"] == list(range(1, 11)) and len(history["loss"]) == 10 and history["eval_loss"]
        metrics = client.get("/api/train/metrics").json()
        assert set(metrics) == {"loss_history", "lr_history", "step_history", "grad_norm_history",
                                "grad_norm_step_history", "current_loss", "current_lr", "current_step"}
        assert metrics["current_step"] == 10 and metrics["current_loss"] == history["loss"][-1]
        with client.stream("GET", "/api/train/progress", headers={"Last-Event-ID": "7"}, timeout=60) as response:
            replayed = [e.id for e in read_sse(response) if e.event == "progress"]
        assert replayed == ["8", "9", "10"]
        assert client.post("/api/train/stop", json={"save": True}).json()["success"] is False
        assert client.post("/api/train/reset", json={}).json()["success"] is True
        assert client.get("/api/train/status").json()["phase"] == "idle"
        assert "cpu" in client.get("/api/train/hardware").json()


def test_server_restart_replays_the_interrupted_jobs_stream(tiny_model: Path, tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "TUNESTUDIO_HOME": str(tmp_path / "home"), "TUNESTUDIO_DATASET_ROOTS": json.dumps(
        [str(DATA), str(tmp_path)])}
    url = f"http://127.0.0.1:{port}"

    def start() -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-m", "tunestudio.cli", "serve", "--port", str(port)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def up() -> bool:
            assert proc.poll() is None, "the server exited"
            try:
                return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(up, 60, "the server to start", every=0.1)
        return proc

    server = start()
    try:
        with httpx.Client(base_url=url, timeout=30) as client:
            job_id = client.post("/api/jobs", json=body(tiny_model, tmp_path, max_steps=2000)).json()["id"]
            wait_until(lambda: (client.get(f"/api/jobs/{job_id}").json()["progress"] or {}).get("step", 0) >= 3,
                       120, "training")
        server.send_signal(signal.SIGKILL)
        server.wait(10)
        server = start()
        with httpx.Client(base_url=url, timeout=30) as client:
            job = client.get(f"/api/jobs/{job_id}").json()
            assert job["status"] == "interrupted"
            events = follow(client, job_id)
            assert [int(e.id) for e in events if e.id] == list(range(1, len(events) + 1))
            assert events[-1].event == "status" and events[-1].json()["status"] == "interrupted"
            assert any(e.event == "progress" for e in events)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)


def test_resume_after_a_restart_takes_the_secrets_again(tmp_path: Path) -> None:
    """Secrets are never stored; the resume body gives them to the new job's worker, and only to it."""

    def secrets_seen(client: httpx.Client, job_id: str) -> str:
        logs = [e.json()["message"] for e in follow(client, job_id) if e.event == "log"]
        return next(m for m in logs if m.startswith("secrets given:"))

    first = JobManager(settings(tmp_path), worker_target=fake_workers.checkpoints_then_fails)
    with running_server(settings(tmp_path), first) as url, httpx.Client(base_url=url, timeout=30) as client:
        job_id = client.post("/api/jobs", json={**body("org/fake", tmp_path), "hf_token": "hf_first"}).json()["id"]
        assert secrets_seen(client, job_id) == "secrets given: hf_token"
        assert client.get(f"/api/jobs/{job_id}").json()["status"] == "failed"
    first.close()
    again = JobManager(settings(tmp_path), worker_target=fake_workers.checkpoints_then_fails)  # a restarted server
    with running_server(settings(tmp_path), again) as url, httpx.Client(base_url=url, timeout=30) as client:
        bad = client.post(f"/api/jobs/{job_id}/resume", json={"hf_tokn": "x"})
        assert bad.status_code == 422 and "hf_tokn" in bad.text
        plain = client.post(f"/api/jobs/{job_id}/resume", json={})
        assert plain.status_code == 201 and secrets_seen(client, plain.json()["id"]) == "secrets given: "
        assert client.post(f"/api/jobs/{job_id}/resume", json={}).status_code == 409  # a job resumes once
        child = plain.json()["id"]  # it failed too (this worker always does): resume it, with secrets
        given = client.post(f"/api/jobs/{child}/resume", json={"hf_token": "hf_second", "wandb_token": "wb_2"})
        assert given.status_code == 201
        assert secrets_seen(client, given.json()["id"]) == "secrets given: hf_token,wandb_token"
        assert given.json()["resumed_from"] == child
    again.close()
    stored = b"".join(f.read_bytes() for f in (tmp_path / "home").rglob("*") if f.is_file())
    assert b"hf_first" not in stored and b"hf_second" not in stored and b"wb_2" not in stored


@pytest.mark.parametrize("path", ["/docs", "/openapi.json", "/healthz"])
def test_docs_and_health_are_served(tmp_path: Path, path: str) -> None:
    with running_server(settings(tmp_path)) as url:
        assert httpx.get(url + path, timeout=30).status_code == 200


def test_delete_offers_a_sources_exports_and_inputs_are_never_outputs(tmp_path: Path) -> None:
    quick = settings(tmp_path)
    manager = JobManager(quick, worker_target=fake_workers.writes_output)
    with running_server(quick, manager) as url, httpx.Client(base_url=url, timeout=30) as client:
        model = tmp_path / "home" / "model"
        model.mkdir(parents=True)
        (model / "config.json").write_text("{}")
        mixed = client.post("/api/jobs", json={**body("org/fake", tmp_path), "model_name": str(model),
                                               "output_dir": str(model), "training_type": "full"})
        assert mixed.status_code == 422, mixed.text
        assert [e["field"] for e in mixed.json()["detail"]["errors"]] == ["output_dir", "model_name"]

        source = client.post("/api/jobs", json=body("org/fake", tmp_path)).json()["id"]
        wait_until(lambda: client.get(f"/api/jobs/{source}").json()["status"] == "completed", 30, "the job")
        for bad in ("~", "~root", "../checkpoint-1", "/etc"):  # a name inside the job's output, nothing else
            refused = client.post(f"/api/jobs/{source}/exports", json={"target": "merged", "checkpoint": bad})
            assert refused.status_code == 422 and refused.json()["detail"]["field"] == "checkpoint", bad
        export = client.post(f"/api/jobs/{source}/exports", json={"target": "merged"}).json()["id"]
        wait_until(lambda: client.get(f"/api/jobs/{export}").json()["status"] == "completed", 30, "the export")
        asked = client.delete(f"/api/jobs/{source}", params={"delete_artifacts": True}, headers=JSON)
        assert asked.status_code == 409 and asked.json()["detail"]["exports"] == [export]
        gone = client.delete(f"/api/jobs/{source}", params={"delete_artifacts": True, "delete_exports": True},
                             headers=JSON)
        assert gone.status_code == 204
        assert client.get(f"/api/jobs/{export}").status_code == 404
    manager.close()


def test_a_job_says_what_it_is_so_clients_keep_no_status_sets(tmp_path: Path) -> None:
    quick = settings(tmp_path)
    manager = JobManager(quick, worker_target=fake_workers.writes_output)
    with running_server(quick, manager) as url, httpx.Client(base_url=url, timeout=30) as client:
        done = client.post("/api/jobs", json=body("org/fake", tmp_path)).json()["id"]
        wait_until(lambda: client.get(f"/api/jobs/{done}").json()["status"] == "completed", 30, "the job")
        job = client.get(f"/api/jobs/{done}").json()
        assert job["is_terminal"] and job["has_result"] and not job["chattable"]  # no adapter or model files
        events = follow(client, done)
        assert events[-1].event == "status" and events[-1].json()["terminal"] is True
        assert not any(e.json().get("terminal") for e in events[:-1] if e.event == "status")
        assert client.get("/api/jobs", params={"live": True}).json()["items"] == []
        assert [j["id"] for j in client.get("/api/jobs").json()["items"]] == [done]
    manager.close()


def test_a_job_stopped_early_is_completed_with_its_reason_and_says_its_best_step(tmp_path: Path) -> None:
    quick = settings(tmp_path)
    manager = JobManager(quick, worker_target=fake_workers.stops_early)
    request = body("org/fake", tmp_path, eval_steps=5, early_stopping={"metric": "exact_match", "patience": 2})
    with running_server(quick, manager) as url, httpx.Client(base_url=url, timeout=30) as client:
        job_id = client.post("/api/jobs", json=request, headers=JSON).json()["id"]
        wait_until(lambda: client.get(f"/api/jobs/{job_id}").json()["is_terminal"], 30, "the job's end")
        job = client.get(f"/api/jobs/{job_id}").json()
        assert job["status"] == "completed" and job["message"] == fake_workers.EARLY_REASON
        assert job["best"] == {"step": 10, "metric": "exact_match", "value": 0.75,
                               "checkpoint": f"{job['output_dir']}/checkpoint-10"}
        assert job["config"]["early_stopping"] == {"metric": "exact_match", "patience": 2, "min_delta": 0.0,
                                                   "mode": "auto"}
        records = client.get(f"/api/jobs/{job_id}/metrics").json()["records"]
        assert {r["step"]: r["extra"]["eval_exact_match"] for r in records if r["eval_loss"] is not None} == \
            fake_workers.EARLY_SCORES  # the watched metric, for the page's chart
        refused = client.post("/api/jobs", json={**request, "eval_steps": 0}, headers=JSON)
        assert refused.status_code == 422 and "early_stopping" in refused.text and "eval_steps" in refused.text
    manager.close()


def test_a_refused_checkpoint_says_nothing_about_whether_its_path_exists(tmp_path: Path) -> None:
    quick = settings(tmp_path)
    manager = JobManager(quick, worker_target=fake_workers.writes_output)
    with running_server(quick, manager) as url, httpx.Client(base_url=url, timeout=30) as client:
        source = client.post("/api/jobs", json=body("org/fake", tmp_path)).json()["id"]
        wait_until(lambda: client.get(f"/api/jobs/{source}").json()["status"] == "completed", 30, "the job")
        outside = tmp_path / "outside"
        (outside / "checkpoint-5").mkdir(parents=True)
        pairs = [  # (a path that exists, one that does not)
            ("/etc", "/no-such-folder-4711"),
            (str(outside / "checkpoint-5"), str(outside / "checkpoint-6")),
            ("~root", "~no-such-user-4711"),
            ("../checkpoint-1", "../checkpoint-99"),
        ]
        for there, missing in pairs:
            said = []
            for raw in (there, missing):
                refused = client.post(f"/api/jobs/{source}/exports", json={"target": "merged", "checkpoint": raw},
                                      headers=JSON)
                assert refused.status_code == 422 and refused.json()["detail"]["field"] == "checkpoint", raw
                said.append(refused.json()["detail"]["message"].replace(repr(raw), "NAME"))
            assert said[0] == said[1], (there, missing, said)
            assert "exist" not in said[0] and "no such" not in said[0]
    manager.close()
