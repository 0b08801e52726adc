"""POST /api/datasets/report: the dataset report through the API, its refusals and its bounds."""

from __future__ import annotations

import threading
from pathlib import Path

import psutil
import pytest
from fastapi.testclient import TestClient

import tunestudio.jobs
from tunestudio.api import create_app
from tunestudio.data_report import runner
from tunestudio.settings import Settings

from ..helpers.hub_cache import hub_planted
from ..helpers.planted import MAX_SEQ_LENGTH, Planted, write_planted
from ..helpers.wait import wait_until


@pytest.fixture
def planted(tmp_path: Path) -> Planted:
    return write_planted(tmp_path)


@pytest.fixture
def spawned_report(monkeypatch: pytest.MonkeyPatch) -> None:
    """The report's child spawned, not forked from the server's warm forkserver: it reads the environment this test
    sets (a fork keeps the forkserver's), and it is still importing when a short bound is reached (a fork answers
    the planted file within 0.3 s). tests/data_report/test_runner.py checks the fork against a spawned child."""
    monkeypatch.setattr(tunestudio.jobs, "warm_context", lambda: None)


@pytest.fixture
def client(tmp_path: Path, tiny_model: Path):
    settings = Settings(home=tmp_path / "home", dataset_roots=[tmp_path], model_roots=[tiny_model.parent])
    with TestClient(create_app(settings), base_url="http://127.0.0.1:8765") as client:
        yield client


def spawned() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if p.is_running()}


@pytest.mark.timeout(240)
def test_the_report_answers_every_part_with_the_planted_counts(client: TestClient, planted: Planted,
                                                               tiny_model: Path) -> None:
    answer = client.post("/api/datasets/report", json={
        "local_datasets": [str(planted.train)], "eval_split": str(planted.eval), "model_name": str(tiny_model),
        "max_seq_length": MAX_SEQ_LENGTH, "dedupe": "near"})
    assert answer.status_code == 200, answer.text
    report = answer.json()
    assert {"rows", "refused", "format", "duplicates", "lengths", "eval_overlap", "columns", "roles"} <= set(report)
    assert [(r["line"], planted.refused[r["line"]] in r["reason"]) for r in report["refused"]] == [
        (line, True) for line in sorted(planted.refused)]
    assert (report["duplicates"]["exact"], report["duplicates"]["near"], report["duplicates"]["removed"]) == (
        len(planted.exact), len(planted.near), len(planted.exact) + len(planted.near))
    assert report["lengths"]["cut_rows"] == len(planted.long) and report["model"] == str(tiny_model)
    assert (report["eval_overlap"]["exact"], report["eval_overlap"]["near"]) == (len(planted.eval_exact),
                                                                                 len(planted.eval_near))


def test_what_a_job_would_refuse_is_a_422_naming_the_field(client: TestClient, planted: Planted,
                                                           tmp_path: Path) -> None:
    outside = client.post("/api/datasets/report", json={"local_datasets": ["/etc/hostname"]})
    assert outside.status_code == 422 and outside.json()["detail"]["code"] == "path_not_allowed"
    missing = client.post("/api/datasets/report", json={"local_datasets": [str(tmp_path / "nope.jsonl")]})
    assert missing.status_code == 422 and missing.json()["detail"]["errors"][0]["field"] == "local_datasets"
    both = client.post("/api/datasets/report", json={"local_datasets": [str(planted.train)], "hf_dataset": "x/y"})
    assert both.status_code == 422 and both.json()["detail"]["errors"][0]["field"] == "hf_dataset"
    outside_hub = client.post("/api/datasets/report", json={"hf_dataset": "/etc"})  # a local `datasets` folder
    assert outside_hub.status_code == 422 and outside_hub.json()["detail"]["field"] == "hf_dataset"
    bad = client.post("/api/datasets/report", json={"local_datasets": [str(planted.train)], "dedupe": "fuzzy"})
    assert bad.status_code == 422


def field_of(answer) -> str:
    return answer.json()["detail"]["errors"][0]["field"]


@pytest.mark.timeout(120)
def test_without_a_model_nothing_is_taken_for_one(planted: Planted, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """No model: no tokenizer and no model path, even with a folder named like a placeholder in the working
    directory (outside the model folders); an empty model_name is refused naming the field, not read as no model
    or as a model."""
    settings = Settings(home=tmp_path / "home", dataset_roots=[tmp_path], model_roots=[tmp_path / "models"])
    monkeypatch.chdir(tmp_path)
    (tmp_path / "none").mkdir()
    body = {"local_datasets": [str(planted.train)]}
    with TestClient(create_app(settings), base_url="http://127.0.0.1:8765") as client:
        answer = client.post("/api/datasets/report", json=body)
        blanks = [client.post("/api/datasets/report", json={**body, "model_name": blank}) for blank in ("", "  ")]
    assert answer.status_code == 200, answer.text
    assert (answer.json()["model"], answer.json()["lengths"]) == (None, None)
    for empty in blanks:
        assert empty.status_code == 422 and empty.json()["detail"]["code"] == "invalid_request"
        assert field_of(empty) == "model_name", empty.text


@pytest.mark.parametrize(("extra", "field", "says"), [
    ({"eval_fraction": 0.2}, "eval_fraction", "set held_out"),  # a job with eval_steps 0 holds nothing out
    ({"held_out": True, "eval_split": "eval.jsonl", "eval_fraction": 0.2}, "eval_fraction", "unset eval_split"),
    ({"held_out_rows": "held_out.json"}, "held_out_rows", "set held_out"),
    ({"held_out": True, "eval_fraction": 0.2, "held_out_rows": "held_out.json"}, "eval_fraction",
     "held_out_rows decides"),
    ({"method": "dpo", "train_on_completions": True}, "train_on_completions", "applies to method sft"),
    ({"dataset_slice_start": 5, "dataset_slice_end": 2}, "dataset_slice_end", "is before"),
])
def test_what_a_job_refuses_of_the_held_out_split_the_report_refuses(client: TestClient, planted: Planted,
                                                                    extra: dict, field: str, says: str) -> None:
    """The job's own checks (config/job.py check_rows, check_options), not fields dropped in silence."""
    answer = client.post("/api/datasets/report", json={"local_datasets": [str(planted.train)], **extra})
    assert answer.status_code == 422 and field_of(answer) == field, answer.text
    assert says in answer.json()["detail"]["message"]


@pytest.mark.timeout(180)
def test_a_hub_dataset_is_read_as_a_job_reads_it_and_its_eval_split_compared(
        client: TestClient, planted: Planted, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        spawned_report: None) -> None:
    """hf_dataset from the local cache (the report's child reads HF_DATASETS_CACHE; no hub); one neither cached
    nor reachable is the job's own message."""
    hub_planted(planted, tmp_path / "cache")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    answer = client.post("/api/datasets/report", json={"hf_dataset": "someorg/planted", "eval_split": "test",
                                                       "max_seq_length": MAX_SEQ_LENGTH})
    assert answer.status_code == 200, answer.text
    overlap = answer.json()["eval_overlap"]
    assert (overlap["eval_rows"], overlap["exact"], overlap["near"]) == (6, len(planted.eval_exact),
                                                                         len(planted.eval_near))
    assert [(r["eval"]["file"], r["eval"]["line"], r["train"]["line"]) for r in overlap["rows"]] == [
        ("someorg/planted[test]", e, t) for e, t in planted.eval_exact + planted.eval_near]
    missing = client.post("/api/datasets/report", json={"hf_dataset": "someorg/not-cached"})
    assert missing.status_code == 422 and missing.json()["detail"]["code"] == "dataset_error"
    assert "'someorg/not-cached'" in missing.json()["detail"]["message"]
    assert "unreachable" in missing.json()["detail"]["message"]


@pytest.mark.timeout(120)
def test_a_method_with_defaults_of_its_own_is_reported(client: TestClient, tmp_path: Path) -> None:
    """pretrain fills packing: true, which the report has no field for (it is not the user's key)."""
    from tunestudio.config import DataSpec

    text = tmp_path / "text.jsonl"
    text.write_text("".join(f'{{"text": "row {i} of plain text"}}\n' for i in range(3)))
    answer = client.post("/api/datasets/report", json={"local_datasets": [str(text)], "method": "pretrain"})
    assert answer.status_code == 200, answer.text
    assert (answer.json()["format"], answer.json()["usable"]) == ("text", 3)
    assert DataSpec(local_datasets=[str(text)], method="pretrain").method == "pretrain"  # the preview's spec too


@pytest.mark.timeout(120)
def test_a_dataset_that_cannot_be_read_is_a_422_with_the_workers_message(client: TestClient,
                                                                        tmp_path: Path) -> None:
    odd = tmp_path / "odd.jsonl"
    odd.write_text('{"question": "q", "answer": "a"}\n')
    answer = client.post("/api/datasets/report", json={"local_datasets": [str(odd)]})
    assert answer.status_code == 422 and answer.json()["detail"]["code"] == "dataset_error"
    assert "not a format tunestudio knows" in answer.json()["detail"]["message"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("bound", "value", "status", "code"), [
    ("REPORT_TIMEOUT_S", 0.3, 504, "timeout"),
    ("REPORT_MAX_RSS", 1 << 20, 413, "too_large"),
])
def test_a_report_past_its_time_or_memory_is_stopped_and_its_child_is_gone(
        client: TestClient, planted: Planted, monkeypatch: pytest.MonkeyPatch, bound: str, value: float,
        status: int, code: str, spawned_report: None) -> None:
    monkeypatch.setattr(runner, bound, value)
    before = spawned()
    answer = client.post("/api/datasets/report", json={"local_datasets": [str(planted.train)]})
    assert answer.status_code == status and answer.json()["detail"]["code"] == code
    wait_until(lambda: not (spawned() - before), 30, "the report's child to be gone")


@pytest.mark.timeout(120)
def test_one_report_runs_at_a_time_and_one_too_many_waiting_is_a_429(client: TestClient, planted: Planted,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    started, release = threading.Event(), threading.Event()

    def held(*args: object, **kwargs: object) -> dict:
        started.set()
        assert release.wait(60)
        return {"held": True}

    monkeypatch.setattr(runner, "run_report", held)
    monkeypatch.setattr(runner, "MAX_WAITING", 0)
    body = {"local_datasets": [str(planted.train)]}
    first: dict = {}
    thread = threading.Thread(target=lambda: first.update(r=client.post("/api/datasets/report", json=body)))
    thread.start()
    try:
        assert started.wait(60)
        busy = client.post("/api/datasets/report", json=body)
        assert busy.status_code == 429 and busy.json()["detail"]["code"] == "busy"
    finally:
        release.set()
        thread.join(60)
    assert first["r"].status_code == 200 and first["r"].json() == {"held": True}
