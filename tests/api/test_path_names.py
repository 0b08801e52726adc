"""A path no filesystem can name (a NUL byte, a name over NAME_MAX) is a 422 on its field, never a 500.

Schemathesis found the 500 on POST /api/jobs/{id}/exports (output_dir with a NUL byte): every os call raises
ValueError on a NUL and OSError (ENAMETOOLONG) on an over-long name, and the path checks met them unguarded.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from tunestudio.api import create_app
from tunestudio.jobs.manager import JobManager
from tunestudio.settings import Settings

from ..helpers import fake_workers
from ..helpers.jobs import DATA

BASE = "http://127.0.0.1:8765"
NUL = "/a\x00b"
DATASET = str(DATA / "alpaca.jsonl")
JOB = {"model_name": "org/fake", "local_datasets": [DATASET], "max_steps": 1}


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, Path]]:
    """A client and its data directory. No job starts: every request here is refused before one would."""
    home = tmp_path_factory.mktemp("names") / "home"
    settings = Settings(home=home, dataset_roots=[DATA])
    manager = JobManager(settings, worker_target=fake_workers.instant)
    with TestClient(create_app(settings, manager), base_url=BASE, headers={"Origin": BASE},
                    raise_server_exceptions=False) as client:
        yield client, home
    manager.close()


def _refused(answer: httpx.Response, field: str) -> None:
    assert answer.status_code == 422, (field, answer.status_code, answer.text)
    detail = answer.json()["detail"]
    named = {e["field"].split(".")[0] for e in detail["errors"]}  # a list's item is named local_datasets.0
    assert {"code", "message"} <= set(detail) and field in named and "Traceback" not in answer.text, detail


@pytest.mark.parametrize(("field", "value", "needs"), [
    ("output_dir", NUL, {}), ("local_datasets", [NUL], {}), ("model_name", NUL, {}), ("eval_split", NUL, {}),
    ("tensorboard_dir", NUL, {}), ("resume_from_checkpoint", NUL, {}), ("held_out_rows", NUL, {"eval_steps": 1}),
    ("mlflow_tracking_uri", NUL, {"report_to": ["mlflow"]}),
    ("reward_functions", [f"{NUL}.py:f"], {"method": "grpo"}),
])
def test_a_job_path_with_a_nul_byte_is_refused_on_its_field(api: tuple[TestClient, Path], field: str,
                                                             value: object, needs: dict) -> None:
    client, _ = api
    _refused(client.post("/api/jobs", json={**JOB, **needs, field: value}), field)


def test_an_export_benchmark_or_report_path_with_a_nul_byte_is_refused_on_its_field(
    api: tuple[TestClient, Path],
) -> None:
    client, _ = api
    for job_id in ("nope", "\u00e9\u65e5\U0001f600"):  # as schemathesis sent it: an id no job has, non-ASCII
        _refused(client.post(f"/api/jobs/{job_id}/exports", json={"target": "merged", "output_dir": NUL}),
                 "output_dir")
        _refused(client.post(f"/api/jobs/{job_id}/benchmarks", json={"eval_file": NUL}), "eval_file")
    for field, value in (("local_datasets", [NUL]), ("model_name", NUL), ("eval_split", NUL)):
        _refused(client.post("/api/datasets/report", json={"local_datasets": [DATASET], field: value}), field)


def test_an_output_folder_name_too_long_for_the_filesystem_is_refused(api: tuple[TestClient, Path]) -> None:
    client, home = api
    too_long = str(home / ("x" * 300))  # NAME_MAX is 255 bytes on the usual filesystems
    _refused(client.post("/api/jobs", json={**JOB, "output_dir": too_long}), "output_dir")
    assert client.get("/api/jobs").json()["total"] == 0


def test_deleting_an_upload_named_longer_than_the_filesystem_allows_is_a_404(api: tuple[TestClient, Path]) -> None:
    client, _ = api
    answer = client.request("DELETE", f"/api/uploads/{'ṱ' * 200}.jsonl", json={})  # 600 bytes: was a 500
    assert answer.status_code == 404 and answer.json()["detail"]["code"] == "not_found"
    long = f"file-{'ṱ' * 200}.jsonl"  # the same name through OpenAI's files API
    assert client.get(f"/v1/files/{long}").status_code == 404
    assert client.request("DELETE", f"/v1/files/{long}", json={}).status_code == 404
