"""Downloads and resource history over HTTP (routes/downloads.py, routes/resources.py), on the session's real chat
job: its adapter as a streamed zip, an export's files one by one and nothing outside them, its metrics as CSV,
and the CPU and memory its worker sampled while it trained."""

from __future__ import annotations

import csv
import io
import json
import os
import zipfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from tunestudio.jobs.models import Job
from tunestudio.settings import Settings

from ..helpers.chat import ChatHome
from ..helpers.jobs import DATA, job_config
from ..helpers.server import running_server
from ..helpers.wait import wait_until

pytestmark = pytest.mark.timeout(600)

NAME = "données 東京"


@pytest.fixture(scope="module")
def job(chat_home: ChatHome) -> Job:
    return chat_home.job


@pytest.fixture(scope="module")
def client(chat_home: ChatHome) -> Iterator[httpx.Client]:
    with running_server(Settings(home=chat_home.home, dataset_roots=[DATA])) as url, \
            httpx.Client(base_url=url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def export(client: httpx.Client, job: Job) -> dict:
    """A merged export of the job, finished."""
    created = client.post(f"/api/jobs/{job.id}/exports", json={"target": "merged"})
    assert created.status_code == 201, created.text
    export_id = created.json()["id"]
    done = wait_until(lambda: (j := client.get(f"/api/jobs/{export_id}").json())["is_terminal"] and j, 300,
                      "the export's end")
    assert done["status"] == "completed", done
    return done


def test_the_adapter_streams_as_a_zip_named_in_unicode(client: httpx.Client, job: Job) -> None:
    assert client.patch(f"/api/jobs/{job.id}", json={"name": NAME}).status_code == 200
    listed = client.get(f"/api/jobs/{job.id}/downloads").json()
    assert listed["weights"]["kind"] == "adapter" and listed["weights"]["filename"] == f"{NAME}-adapter.zip"
    with client.stream("GET", f"/api/jobs/{job.id}/download") as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/zip"
        assert "content-length" not in response.headers  # streamed as it is made, not built first
        disposition = response.headers["content-disposition"]
        body = response.read()
    assert f"filename*=UTF-8''{quote(NAME + '-adapter.zip', safe='')}" in disposition
    assert disposition.startswith('attachment; filename="') and disposition.isascii()
    out = Path(job.output_dir or "")
    archive = zipfile.ZipFile(io.BytesIO(body))
    assert archive.testzip() is None
    names = set(archive.namelist())
    assert {"adapter_model.safetensors", "adapter_config.json"} <= names
    assert archive.read("adapter_model.safetensors") == (out / "adapter_model.safetensors").read_bytes()
    # Its final weights and what goes with them: no checkpoint folder, nothing hidden (the ownership marker).
    assert all("/" not in n and not n.startswith(".") for n in names), names
    assert names == {f["name"] for f in listed["weights"]["files"]}


def test_an_export_lists_its_files_with_sizes_and_serves_only_those(client: httpx.Client, job: Job,
                                                                   export: dict) -> None:
    export_id, folder = export["id"], Path(export["output_dir"])
    files = {f["name"]: f["bytes"] for f in client.get(f"/api/jobs/{export_id}/downloads").json()["files"]}
    assert "config.json" in files and "model.safetensors" in files
    assert files["model.safetensors"] == (folder / "model.safetensors").stat().st_size
    got = client.get(f"/api/jobs/{export_id}/files/config.json")
    assert got.status_code == 200 and got.content == (folder / "config.json").read_bytes()
    assert "filename*=UTF-8''config.json" in got.headers["content-disposition"]
    # The training job lists its export and the export's files.
    exports = client.get(f"/api/jobs/{job.id}/downloads").json()["exports"]
    assert [(e["id"], e["target"]) for e in exports] == [(export_id, "merged")]
    assert {f["name"]: f["bytes"] for f in exports[0]["files"]} == files
    # An export has no adapter of its own: the zip is refused, saying why.
    refused = client.get(f"/api/jobs/{export_id}/download")
    assert refused.status_code == 409 and "no adapter or model of its own" in refused.json()["detail"]["message"]

    # Nothing outside the listed files: the job's own marker, a link planted in the folder, a way out.
    outside = folder.parent / "secret.txt"
    outside.write_text("not the export's")
    os.symlink(outside, folder / "link.txt")
    assert "link.txt" not in {f["name"] for f in client.get(f"/api/jobs/{export_id}/files").json()}
    for name in (".tunestudio-owner.json", "link.txt", "%2e%2e/secret.txt", "..%2Fsecret.txt",
                 quote(str(outside), safe=""), "%2Fetc%2Fpasswd"):
        answer = client.get(f"/api/jobs/{export_id}/files/{name}")
        assert answer.status_code == 404, (name, answer.status_code)
        assert b"not the export's" not in answer.content


def test_a_job_without_a_result_gets_409_saying_why(client: httpx.Client, job: Job, tiny_model: Path,
                                                   chat_home: ChatHome) -> None:
    config = job_config(tiny_model, chat_home.home / "cancelled-job").model_dump(mode="json")
    created = client.post("/api/jobs", json=config)
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    early = client.get(f"/api/jobs/{job_id}/download")  # queued or starting: nothing yet
    assert early.status_code == 409 and "has no result to download" in early.json()["detail"]["message"]
    assert client.post(f"/api/jobs/{job_id}/cancel", json={}).status_code == 200
    wait_until(lambda: client.get(f"/api/jobs/{job_id}").json()["is_terminal"], 120, "the cancelled job's end")
    refused = client.get(f"/api/jobs/{job_id}/download")
    assert refused.status_code == 409
    assert refused.json()["detail"]["message"] == f"job {job_id} has no result to download: it is cancelled"
    found = client.get(f"/api/jobs/{job_id}/downloads").json()
    assert found["weights"] is None and found["weights_note"] == refused.json()["detail"]["message"]
    assert client.get("/api/jobs/nope/download").status_code == 404


def test_the_metrics_as_csv(client: httpx.Client, job: Job) -> None:
    response = client.get(f"/api/jobs/{job.id}/metrics.csv")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/csv")
    assert "-metrics.csv" in response.headers["content-disposition"]
    rows = list(csv.DictReader(io.StringIO(response.text)))
    records = client.get(f"/api/jobs/{job.id}/metrics").json()["records"]
    assert len(rows) == len(records) and len(rows) > 40  # 40 training steps, and the evaluations
    assert [int(r["step"]) for r in rows] == [r["step"] for r in records]
    trained = [r for r in rows if r["loss"]]
    assert len(trained) == 40 and all(float(r["learning_rate"]) >= 0 for r in trained)
    assert any(r["eval_loss"] for r in rows)  # the evaluations, in the same file
    assert float(trained[-1]["loss"]) == pytest.approx(next(r["loss"] for r in reversed(records) if r["loss"]))
    # The method's own metrics (SFT: token accuracy) are columns too.
    assert "mean_token_accuracy" in rows[0]


def test_the_worker_sampled_cpu_and_memory_while_it_trained(client: httpx.Client, job: Job) -> None:
    samples = client.get(f"/api/jobs/{job.id}/resources").json()["samples"]
    assert len(samples) >= 2, samples  # every 2 s while the job ran
    assert all(s["rss_mb"] > 50 and s["cpu_percent"] >= 0 and s["processes"] >= 1 for s in samples)
    assert max(s["cpu_percent"] for s in samples) > 10  # training keeps a core busy
    assert [s["seq"] for s in samples] == sorted(s["seq"] for s in samples)
    assert all(s["gpu_memory_mb"] is None for s in samples)  # a CPU job
    assert job.started_at is not None and job.finished_at is not None
    assert all(job.started_at <= s["ts"] <= job.finished_at + 5 for s in samples)
    # Up to a place in the stream: what a page loaded at that seq reads, the stream gives the rest.
    cut = samples[len(samples) // 2]["seq"]
    first = client.get(f"/api/jobs/{job.id}/resources", params={"upto": cut}).json()["samples"]
    assert first == [s for s in samples if s["seq"] <= cut]
    # They are the job's stream's own events: a reload replays them from the store.
    with client.stream("GET", f"/api/jobs/{job.id}/events", params={"after": 0}) as stream:
        kinds = [json.loads(line[5:]) for line in stream.iter_lines() if line.startswith("data:")]
    assert sum(1 for k in kinds if k.get("kind") == "resources") == len(samples)
