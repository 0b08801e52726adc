"""The estimate before Start on a real-shaped model (116M parameters, a 128k vocabulary): from arithmetic when
nothing ran here, then from the speed an earlier job measured, against what a second job really takes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.helpers.jobs import DATA, job_config
from tests.helpers.real_shaped import build_real_shaped
from tests.helpers.wait import wait_until
from tunestudio.api import create_app
from tunestudio.jobs.manager import JobManager
from tunestudio.jobs.models import Job
from tunestudio.jobs.status import JobStatus
from tunestudio.settings import Settings

pytestmark = pytest.mark.timeout(1200)
SHAPE = {"training_type": "lora", "lora_r": 8, "max_seq_length": 96, "gradient_accumulation_steps": 1,
         "precision": "fp32", "eval_steps": 0, "sample_prompts": []}


@pytest.fixture(scope="module")
def model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_real_shaped(tmp_path_factory.mktemp("real-shaped") / "llama-116m", tiny_model)


@pytest.fixture(scope="module")
def client(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, JobManager]]:
    home = tmp_path_factory.mktemp("estimate-home")
    settings = Settings(home=home, model_roots=[model.parent], dataset_roots=[DATA])
    manager = JobManager(settings)
    with TestClient(create_app(settings, manager), base_url="http://127.0.0.1:8765") as client:
        yield client, manager
    manager.close()


def _run(manager: JobManager, model: Path, out: Path, **fields: object) -> Job:
    job = manager.submit(job_config(model, out, **{**SHAPE, **fields}))
    job = wait_until(lambda: j if (j := manager.get(job.id)).status.is_terminal else None, 900, "the job's end")
    assert job.status is JobStatus.completed, job.error
    return job


def _estimate(client: TestClient, model: Path, **fields: object) -> dict:
    answer = client.post("/api/models/estimate", json={"model_name": str(model), **SHAPE, **fields})
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_the_estimate_learns_this_machines_speed_and_predicts_the_next_job(
        client: tuple[TestClient, JobManager], model: Path, tmp_path: Path) -> None:
    api, manager = client
    first = {"batch_size": 2, "max_steps": 6}
    before = _estimate(api, model, **first)
    assert before["seconds_source"] == "arithmetic" and before["parameters"] > 100_000_000
    assert before["steps"] == 6 and before["total_seconds"] > 6 * before["seconds_per_step"]
    assert any("no job has run on this machine" in b for b in before["basis"])

    a = _run(manager, model, tmp_path / "a", **first)
    measured_a = a.progress["elapsed_seconds"] / a.progress["step"]
    tokens_per_row = a.progress["num_tokens"] / (a.progress["step"] * 2)
    print(f"arithmetic estimate {before['seconds_per_step']:.2f} s a step ({before['tokens_per_step']} tokens), "
          f"measured {measured_a:.2f} s ({tokens_per_row * 2:.0f} tokens)")

    # The next job, twice the batch: its speed comes from job A, its tokens from the rows' real length.
    second = {"batch_size": 4, "max_steps": 4}
    predicted = _estimate(api, model, **second, dataset={"tokens_per_row": tokens_per_row, "rows": 400})
    assert predicted["seconds_source"] == "measured" and a.id in " ".join(predicted["basis"])
    assert predicted["tokens_per_step"] == pytest.approx(4 * tokens_per_row, abs=1)
    b = _run(manager, model, tmp_path / "b", **second)
    measured_b = b.progress["elapsed_seconds"] / b.progress["step"]
    wall_b = b.finished_at - b.started_at
    print(f"predicted {predicted['seconds_per_step']:.2f} s a step, {predicted['total_seconds']:.1f} s in all; "
          f"measured {measured_b:.2f} s a step, {wall_b:.1f} s in all")
    # Time a step scales with tokens from one measured job; a step's fixed costs (the optimizer, the fused head's
    # chunks) make twice the tokens cost less than twice the time, so the prediction errs high: within 3x here
    # (0.47-0.69 measured over predicted on a loaded 2-core machine), where the arithmetic alone was 7x off.
    assert 1 / 3 < measured_b / predicted["seconds_per_step"] < 3
    assert 1 / 3 < wall_b / predicted["total_seconds"] < 3

    # As it stood before job A finished (a job page's "estimated before start"): arithmetic again.
    assert _estimate(api, model, **first, as_of=a.created_at)["seconds_source"] == "arithmetic"
