"""Benchmarks: the real lm-evaluation-harness in a bench job's worker, against a real server's /v1, on the
session's trained LoRA job and its base model: a multiple-choice task made of the data it learned (loglikelihoods
through /v1/completions) and a generation task of its questions and answers (exact match through
/v1/chat/completions). The server counts the requests of each path."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from tunestudio.api import create_app
from tunestudio.jobs.models import Job
from tunestudio.settings import Settings
from tunestudio.worker.tiny import alpaca_user_text

from ..helpers.chat import ChatHome
from ..helpers.jobs import DATA
from ..helpers.wait import wait_until

pytestmark = pytest.mark.timeout(900)  # the session's chat job trains first (minutes on a busy machine)
ROWS = 80  # at most: every distinct question of the data with 4 answers to choose from (71)


def lookup_questions(path: Path, count: int = ROWS, seed: int = 3) -> Path:
    """Multiple-choice questions from the job's own training rows: the right output among 3 others that answer
    the same instruction elsewhere in the data (a task the job learned, and its base model did not)."""
    rows = [json.loads(line) for line in (DATA / "alpaca.jsonl").read_text().splitlines()]
    outputs: dict[str, list[str]] = {}
    for row in rows:
        outputs.setdefault(row["instruction"], [])
        if row["output"] not in outputs[row["instruction"]]:
            outputs[row["instruction"]].append(row["output"])
    rng = random.Random(seed)
    seen: set[str] = set()
    questions: list[dict[str, Any]] = []
    for row in rows:
        question = alpaca_user_text(row)
        if question in seen or len(outputs[row["instruction"]]) < 4:
            continue
        seen.add(question)
        wrong = rng.sample([o for o in outputs[row["instruction"]] if o != row["output"]], 3)
        choices = [row["output"], *wrong]
        rng.shuffle(choices)
        questions.append({"question": question, "choices": choices, "answer": row["output"]})
        if len(questions) == count:
            break
    path.write_text("".join(json.dumps(q) + "\n" for q in questions))
    return path


def answers_file(path: Path, count: int = 6) -> Path:
    """Generation rows {question, answer} from the job's own training rows (distinct questions)."""
    rows = [json.loads(line) for line in (DATA / "alpaca.jsonl").read_text().splitlines()]
    seen: dict[str, str] = {}
    for row in rows:
        seen.setdefault(alpaca_user_text(row), row["output"])
    path.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in list(seen.items())[:count]))
    return path


@contextmanager
def counting_server(settings: Settings) -> Iterator[tuple[str, Counter[str]]]:
    """The app on a free loopback port, behind a wrapper that counts the HTTP requests of each path."""
    app = create_app(settings)
    hits: Counter[str] = Counter()

    async def counted(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            hits[scope["path"]] += 1
        await app(scope, receive, send)

    server = uvicorn.Server(uvicorn.Config(counted, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), 30, "the test server to start")
    assert server.started, "the test server did not start"
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}", hits
    finally:
        server.should_exit = True
        thread.join(30)


@pytest.fixture(scope="module")
def job(chat_home: ChatHome) -> Job:
    return chat_home.job


@pytest.fixture(scope="module")
def questions(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return lookup_questions(tmp_path_factory.mktemp("bench") / "lookup.jsonl")


@pytest.fixture(scope="module")
def served(job: Job, chat_home: ChatHome, questions: Path) -> Iterator[tuple[str, Counter[str]]]:
    with counting_server(Settings(home=chat_home.home, dataset_roots=[DATA, questions.parent])) as (url, hits):
        yield url, hits


@pytest.fixture(scope="module")
def server(served: tuple[str, Counter[str]]) -> str:
    return served[0]


def finished(server: str, job_id: str, bench_id: str, timeout: float) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        listed = httpx.get(f"{server}/api/jobs/{job_id}/benchmarks", timeout=30).json()["benchmarks"]
        mine = next(b for b in listed if b["id"] == bench_id)
        return mine if mine["is_terminal"] else None

    return wait_until(done, timeout, f"benchmark {bench_id} to end", every=0.5)


@pytest.fixture(scope="module")
def lookup_run(server: str, job: Job, questions: Path) -> dict[str, Any]:
    """One benchmark of the job on the questions it learned: the bench job's answer, and its listing at the end."""
    answer = httpx.post(f"{server}/api/jobs/{job.id}/benchmarks", timeout=30, json={"eval_file": str(questions)})
    assert answer.status_code == 201, answer.text
    bench = answer.json()
    return {"job": bench, "run": finished(server, job.id, bench["id"], 600)}


def test_accuracy_after_training_is_above_before_on_a_task_the_job_learned(server: str, job: Job, questions: Path,
                                                                           lookup_run: dict[str, Any]) -> None:
    bench, run = lookup_run["job"], lookup_run["run"]
    assert bench["kind"] == "bench" and bench["source_job"] == job.id
    assert run["status"] == "completed", run["error"]
    result = run["result"]
    assert result["harness"] == "lm-eval 0.4.13" and result["chat_template"] is True
    assert result["models"] == {"before": f"{job.id}:base", "after": job.id}
    task = result["tasks"]["tunestudio_lookup"]
    assert task["version"] == 1.0 and task["samples"] == len(questions.read_text().splitlines()) > 50
    acc = task["metrics"]["acc"]
    assert acc["after"] > acc["before"] and acc["difference"] == pytest.approx(acc["after"] - acc["before"])
    assert acc["stderr"] > 0 and acc["stderr_before"] >= 0
    assert task["via"] == "local-completions"
    assert result["runs"] == [{"model": "local-completions", "url": f"{server}/v1/completions",
                               "tasks": ["tunestudio_lookup"]}]
    output = httpx.get(f"{server}/api/jobs/{bench['id']}", timeout=30).json()["output_dir"]
    stored = json.loads((Path(output) / "benchmarks.json").read_text())
    assert stored["tasks"] == result["tasks"]


def test_a_generation_file_runs_through_chat_completions_scored_by_exact_match(
        served: tuple[str, Counter[str]], job: Job, questions: Path) -> None:
    server, hits = served
    answers = answers_file(questions.parent / "answers.jsonl")
    rows = len(answers.read_text().splitlines())
    chat_before, completions_before = hits["/v1/chat/completions"], hits["/v1/completions"]
    answer = httpx.post(f"{server}/api/jobs/{job.id}/benchmarks", timeout=30, json={"eval_file": str(answers)})
    assert answer.status_code == 201, answer.text
    run = finished(server, job.id, answer.json()["id"], 600)
    assert run["status"] == "completed", run["error"]
    result = run["result"]
    assert result["runs"] == [{"model": "local-chat-completions", "url": f"{server}/v1/chat/completions",
                               "tasks": ["tunestudio_answers"]}]
    task = result["tasks"]["tunestudio_answers"]
    assert task["via"] == "local-chat-completions" and task["samples"] == rows
    exact = task["metrics"]["exact_match (strip)"]
    assert 0 <= exact["before"] <= 1 and 0 <= exact["after"] <= 1
    assert exact["difference"] == pytest.approx(exact["after"] - exact["before"])
    # each row asked once of each model, one chat completion each; no completion at all
    assert hits["/v1/chat/completions"] - chat_before == 2 * rows
    assert hits["/v1/completions"] == completions_before


def test_the_lm_eval_cli_on_the_same_task_and_server_agrees(server: str, job: Job, chat_home: ChatHome,
                                                           lookup_run: dict[str, Any], tmp_path: Path) -> None:
    """The harness's own command line, pointed at this server with the task YAML the studio wrote: the same
    accuracy as the bench job's "after"."""
    output = Path(httpx.get(f"{server}/api/jobs/{lookup_run['job']['id']}", timeout=30).json()["output_dir"])
    tokenizer = job.output_dir
    args = [str(Path(sys.executable).with_name("lm_eval")), "--model", "local-completions", "--model_args",
            f"base_url={server}/v1/completions,model={job.id},tokenizer_backend=huggingface,tokenizer={tokenizer},"
            "tokenized_requests=True,max_length=512,max_retries=1", "--tasks", "tunestudio_lookup",
            "--include_path", str(output / "tasks"), "--apply_chat_template", "--batch_size", "16",
            "--output_path", str(tmp_path / "out")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OPENAI_API_KEY": "unused"}
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(next((tmp_path / "out").rglob("results_*.json")).read_text())
    after = lookup_run["run"]["result"]["tasks"]["tunestudio_lookup"]["metrics"]["acc"]["after"]
    assert results["results"]["tunestudio_lookup"]["acc,none"] == pytest.approx(after, abs=1e-12)


def test_a_standard_task_whose_data_is_not_here_fails_at_once_naming_it(server: str, job: Job) -> None:
    answer = httpx.post(f"{server}/api/jobs/{job.id}/benchmarks", json={"tasks": ["arc_easy"], "limit": 2},
                        timeout=30)
    assert answer.status_code == 201, answer.text
    run = finished(server, job.id, answer.json()["id"], 300)
    assert run["status"] == "failed"
    assert "arc_easy" in run["error"] and "ai2_arc" in run["error"] and "Download" in run["error"]
    assert run["result"] is None
    assert run["phase"] == "loading_dataset"  # it failed before any model was asked (evaluating_base)


def test_bad_benchmark_requests_name_the_field(server: str, job: Job, tmp_path: Path,
                                              lookup_run: dict[str, Any]) -> None:
    def post(job_id: str, body: dict) -> httpx.Response:
        return httpx.post(f"{server}/api/jobs/{job_id}/benchmarks", json=body, timeout=30)

    # After a benchmark (lookup_run) the harness's index is cached: a task it lacks is refused before any job.
    listed = len(httpx.get(f"{server}/api/jobs/{job.id}/benchmarks", timeout=30).json()["benchmarks"])
    unknown = post(job.id, {"tasks": ["arc_easy", "no_such_task_xyz"]})
    assert unknown.status_code == 422, unknown.text
    detail = unknown.json()["detail"]
    assert detail["field"] == "tasks" and detail["errors"] == [
        {"field": "tasks", "message": "lm-evaluation-harness has no task or group named 'no_such_task_xyz'"}]
    assert len(httpx.get(f"{server}/api/jobs/{job.id}/benchmarks", timeout=30).json()["benchmarks"]) == listed

    nothing = post(job.id, {})
    assert nothing.status_code == 422 and "tasks" in nothing.text
    outside = post(job.id, {"eval_file": str(tmp_path / "q.jsonl")})
    assert outside.status_code == 422 and outside.json()["detail"]["field"] == "eval_file"
    assert post("no-such-job", {"tasks": ["arc_easy"]}).status_code == 404
    assert post(job.id, {"tasks": ["bad name!"]}).status_code == 422
    bench_jobs = [b["id"] for b in httpx.get(f"{server}/api/jobs/{job.id}/benchmarks", timeout=30)
                  .json()["benchmarks"]]
    if bench_jobs:  # a benchmark measures a training job, not another benchmark
        assert post(bench_jobs[0], {"tasks": ["arc_easy"]}).status_code == 409


def test_a_cancelled_benchmark_ends_at_once_without_figures(server: str, job: Job, questions: Path,
                                                             lookup_run: dict[str, Any]) -> None:
    key = {"Idempotency-Key": "bench-cancelled"}
    answer = httpx.post(f"{server}/api/jobs/{job.id}/benchmarks", json={"eval_file": str(questions)}, headers=key,
                        timeout=30)
    assert answer.status_code == 201, answer.text
    bench_id = answer.json()["id"]
    wait_until(lambda: httpx.get(f"{server}/api/jobs/{bench_id}", timeout=30).json()["phase"] == "evaluating_base",
               300, "the benchmark to ask the base model", every=0.2)
    assert httpx.post(f"{server}/api/jobs/{bench_id}/cancel", json={}, timeout=30).status_code == 200
    run = finished(server, job.id, bench_id, 120)
    assert run["status"] == "cancelled" and run["result"] is None
    # The request sent again, say by a client that never heard the answer: its job, whatever the body now asks
    # (here a task the index, cached by lookup_run's benchmark, lacks: a new request is refused for it).
    again = httpx.post(f"{server}/api/jobs/{job.id}/benchmarks", json={"tasks": ["no_such_task_xyz"]}, headers=key,
                       timeout=30)
    assert again.status_code == 201 and again.json()["id"] == bench_id, again.text
    fresh = httpx.post(f"{server}/api/jobs/{job.id}/benchmarks", json={"tasks": ["no_such_task_xyz"]}, timeout=30)
    assert fresh.status_code == 422 and fresh.json()["detail"]["field"] == "tasks", fresh.text

