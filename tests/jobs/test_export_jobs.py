"""Exports as jobs: through the manager (queue, store, stream, cancel), the CLI and the HTTP API.

One real LoRA job is trained once for the module on a data directory; every
test exports it with its own manager (or CLI process, or server) on that
directory, as a user does after training.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tunestudio.export_config import ExportOptions
from tunestudio.jobs.manager import JobManager
from tunestudio.jobs.models import Job, JobConflict, JobNotFound
from tunestudio.jobs.status import JobStatus
from tunestudio.settings import Settings

from ..helpers.jobs import DATA, job_config
from ..helpers.server import running_server
from ..helpers.wait import wait_until

S = JobStatus
CLI = [sys.executable, "-m", "tunestudio.cli"]


def wait_end(manager: JobManager, job_id: str, timeout: float = 180) -> Job:
    wait_until(lambda: manager.get(job_id).status.is_terminal, timeout, f"job {job_id} to end")
    return manager.get(job_id)


@pytest.fixture(scope="module")
def trained(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """(home, id) of a completed LoRA job whose output lies in the data directory's default place."""
    home = tmp_path_factory.mktemp("export-home")
    with JobManager(Settings(home=home)) as manager:
        cfg = job_config(tiny_model, Path("unused"), max_steps=8).model_copy(update={"output_dir": None})
        job = manager.submit(cfg)
        done = wait_end(manager, job.id, 240)
    assert done.status is S.completed, done.error
    return home, job.id


def test_an_export_is_a_job_linked_to_its_source_and_survives_a_restart(trained: tuple[Path, str]) -> None:
    home, source_id = trained
    with JobManager(Settings(home=home)) as manager:
        export = manager.export(source_id, ExportOptions(target="merged", dtype="bf16"))
        # The record is read back after the scheduler may have picked it up: queued, or already starting (its
        # stream below says it was queued first).
        assert export.kind == "export" and export.source_job == source_id and export.status in (S.queued, S.starting)
        done = wait_end(manager, export.id)
        assert done.status is S.completed, done.error
        source = manager.get(source_id)
        assert done.output_dir == str(Path(source.output_dir) / "exports" / "merged-bf16")
        files = {p.name for p in Path(done.output_dir).iterdir()}
        assert {"model.safetensors", "tokenizer.json", "export.json"} <= files
        assert done.progress and done.progress["step"] == done.progress["total_steps"] == 100
        statuses = [e.data["status"] for e in manager.subscribe(export.id).replay if e.kind == "status"]
        assert statuses[0] == "queued" and statuses[-1] == "completed" and "saving" in statuses
        with pytest.raises(JobConflict, match="exports do not resume"):
            manager.resume(export.id)
        with pytest.raises(JobConflict, match="is an export"):
            manager.export(export.id, ExportOptions(target="merged"))
    with JobManager(Settings(home=home)) as again:  # a restart: the record is in the store
        listed = {job.id: job for job in again.list()}
        assert listed[export.id].kind == "export" and listed[export.id].source_job == source_id
        assert listed[export.id].status is S.completed and listed[source_id].kind == "train"


def test_cancelling_an_export_leaves_no_file(trained: tuple[Path, str], tmp_path: Path) -> None:
    home, source_id = trained
    with JobManager(Settings(home=home)) as manager:
        export = manager.export(source_id, ExportOptions(target="gguf", quantization="q8_0"))
        wait_until(lambda: manager.get(export.id).status in (S.loading_model, S.saving), 120, "the export to run")
        manager.cancel(export.id)
        done = wait_end(manager, export.id)
    assert done.status is S.cancelled, (done.status, done.error)
    out = Path(done.output_dir)
    assert out.name == "gguf-q8_0" and not out.exists()
    assert not (out.parent / ".gguf-q8_0.partial").exists()


def test_exports_refuse_what_they_cannot_do(trained: tuple[Path, str], tiny_model: Path) -> None:
    home, source_id = trained
    with JobManager(Settings(home=home)) as manager:
        with pytest.raises(JobNotFound):
            manager.export("no-such-job", ExportOptions(target="merged"))
        source = manager.get(source_id)
        with pytest.raises(ValueError, match="own output folder"):
            manager.export(source_id, ExportOptions(target="merged", output_dir=source.output_dir))
        with pytest.raises(ValueError, match="jobs/ folder"):
            manager.export(source_id, ExportOptions(target="merged", output_dir=str(home / "jobs" / "x")))
        queued = manager.submit(job_config(tiny_model, home / "elsewhere", max_steps=500))
        with pytest.raises(JobConflict, match="only a completed job"):
            manager.export(queued.id, ExportOptions(target="merged"))
        manager.cancel(queued.id)


def test_cli_export_shows_progress_and_exits_like_train(trained: tuple[Path, str], tmp_path: Path) -> None:
    home, source_id = trained
    env = {**os.environ, "TUNESTUDIO_HOME": str(home), "COLUMNS": "200"}
    out = tmp_path / "lora-gguf"
    proc = subprocess.run([*CLI, "export", source_id, "--to", "gguf-lora", "--output", str(out)],
                          capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"export of job {source_id} as gguf-lora" in proc.stdout and "completed" in proc.stdout
    assert str(out) in proc.stdout and (out / "adapter-f16.gguf").is_file()
    bad = subprocess.run([*CLI, "export", source_id, "--to", "gguf", "--quantization", "q3"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert bad.returncode == 2 and "quantization" in bad.stderr and "Traceback" not in bad.stderr
    missing = subprocess.run([*CLI, "export", "nope", "--to", "merged"], capture_output=True, text=True, env=env,
                             timeout=60)
    assert missing.returncode == 2 and "nope" in missing.stderr


def test_cli_export_that_fails_exits_1(trained: tuple[Path, str], tmp_path: Path) -> None:
    home, source_id = trained
    env = {**os.environ, "TUNESTUDIO_HOME": str(home), "COLUMNS": "200", "HF_TOKEN": "hf_CLISECRET_99",
           "HF_ENDPOINT": "http://127.0.0.1:9"}  # the discard port: nothing listens there
    proc = subprocess.run([*CLI, "export", source_id, "--to", "hub", "--repo", "me/tiny"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "hub unreachable" in proc.stdout and "hf_CLISECRET_99" not in proc.stdout + proc.stderr
    db_rows = subprocess.run([*CLI, "jobs", "list"], capture_output=True, text=True, env=env, timeout=60)
    assert "hf_CLISECRET_99" not in db_rows.stdout
    assert b"hf_CLISECRET_99" not in (home / "tunestudio.db").read_bytes()


def test_api_post_exports_answers_201_with_the_export_job(
    trained: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    home, source_id = trained
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the hub export below fails at once, offline
    settings = Settings(home=home, dataset_roots=[DATA])
    with running_server(settings) as url, httpx.Client(base_url=url, timeout=30) as client:
        created = client.post(f"/api/jobs/{source_id}/exports", json={"target": "gguf", "quantization": "f16"})
        assert created.status_code == 201, created.text
        job = created.json()
        assert job["kind"] == "export" and job["source_job"] == source_id
        # the job as it stands when answered: a free slot may have started it already
        assert job["status"] in ("queued", "starting", "running"), job["status"]
        wait_until(lambda: client.get(f"/api/jobs/{job['id']}").json()["status"] == "completed", 180,
                   "the export to complete")
        final = client.get(f"/api/jobs/{job['id']}").json()
        assert {a["name"] for a in final["artefacts"]} == {"model-f16.gguf", "Modelfile", "export.json"}
        listed = client.get("/api/jobs").json()["items"]
        assert any(item["id"] == job["id"] and item["kind"] == "export" for item in listed)

        bad = client.post(f"/api/jobs/{source_id}/exports", json={"target": "gguf", "quantization": "q3"})
        assert bad.status_code == 422 and "quantization" in bad.text
        outside = client.post(f"/api/jobs/{source_id}/exports", json={"target": "merged", "output_dir": "/tmp/x"})
        assert outside.status_code == 422 and outside.json()["detail"]["field"] == "output_dir"
        assert client.post("/api/jobs/nope/exports", json={"target": "merged"}).status_code == 404
        secret = client.post(f"/api/jobs/{source_id}/exports",
                             json={"target": "hub", "repo": "me/tiny", "hf_token": "hf_APISECRET_1"})
        assert secret.status_code == 201 and "hf_APISECRET_1" not in secret.text
        assert "hf_APISECRET_1" not in json.dumps(client.get(f"/api/jobs/{secret.json()['id']}").json())
