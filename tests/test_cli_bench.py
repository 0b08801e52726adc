"""`tunestudio bench` as a user runs it: a real process serving /v1/completions and /v1/chat/completions for its
run, a real bench worker and the real harness on the session's chat job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from tunestudio.cli.bench import results_table
from tunestudio.jobs.models import Job
from tunestudio.worker.tiny import alpaca_user_text

from .helpers.chat import ChatHome
from .helpers.jobs import DATA

CLI = [sys.executable, "-m", "tunestudio.cli"]
pytestmark = pytest.mark.timeout(900)  # the session's chat job trains first


def bench(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TUNESTUDIO_HOME": str(home), "COLUMNS": "200"}
    return subprocess.run([*CLI, "bench", *args], capture_output=True, text=True, env=env, timeout=600)


def test_an_unknown_task_fails_naming_it_and_a_bad_option_names_the_field(chat_home: ChatHome) -> None:
    job: Job = chat_home.job
    unknown = bench(chat_home.home, job.id, "--tasks", "no_such_task_xyz")
    assert unknown.returncode == 1, unknown.stdout + unknown.stderr
    assert "no task or group named 'no_such_task_xyz'" in unknown.stdout + unknown.stderr
    # That benchmark's worker cached the harness's index in the data directory: now an unknown task is refused
    # before anything starts (no job recorded), naming the field, each task and the names near it.
    recorded = sorted((chat_home.home / "jobs").iterdir())  # a folder per job (its log)
    again = bench(chat_home.home, job.id, "--tasks", "no_such_task_xyz,arc_eas,arc_easy")
    assert again.returncode == 2, again.stdout + again.stderr
    assert "tasks: lm-evaluation-harness has no task or group named 'no_such_task_xyz'" in again.stderr
    assert "tasks: lm-evaluation-harness has no task or group named 'arc_eas' (did you mean arc_easy, " in \
        again.stderr and "'arc_easy'" not in again.stderr
    assert sorted((chat_home.home / "jobs").iterdir()) == recorded
    nothing = bench(chat_home.home, job.id)
    assert nothing.returncode == 2 and "tasks" in nothing.stderr
    missing = bench(chat_home.home, "no-such-job", "--tasks", "arc_easy")
    assert missing.returncode == 2 and "no-such-job" in missing.stderr


def test_a_benchmark_of_a_generation_file_prints_its_figures(chat_home: ChatHome, tmp_path: Path) -> None:
    job: Job = chat_home.job
    rows = [json.loads(line) for line in (DATA / "alpaca.jsonl").read_text().splitlines()[:2]]
    answers = tmp_path / "answers.jsonl"
    answers.write_text("".join(json.dumps({"question": alpaca_user_text(r), "answer": r["output"]}) + "\n"
                               for r in rows))
    run = bench(chat_home.home, job.id, "--eval-file", str(answers), "--json")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(run.stdout[run.stdout.index("\n{") + 1:])  # after the progress lines, the figures
    assert result["models"] == {"before": f"{job.id}:base", "after": job.id} and result["chat_template"] is True
    [harness] = result["runs"]
    assert harness["model"] == "local-chat-completions" and harness["url"].startswith("http://127.0.0.1:")
    assert harness["url"].endswith("/v1/chat/completions") and harness["tasks"] == ["tunestudio_answers"]
    task = result["tasks"]["tunestudio_answers"]
    assert task["samples"] == 2 and task["via"] == "local-chat-completions"
    exact = task["metrics"]["exact_match (strip)"]
    assert exact["before"] in (0.0, 0.5, 1.0) and exact["after"] in (0.0, 0.5, 1.0)
    console = Console(record=True, width=200)
    console.print(results_table(result))  # what the command prints without --json
    table = console.export_text()
    assert f"{job.id}:base → {job.id}" in table and "tunestudio_answers" in table and "exact_match (strip)" in table
