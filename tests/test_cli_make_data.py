"""`tunestudio data make RECIPE.yaml` as a user runs it (a real CLI process, a real worker, the scripted teacher of
tests/helpers/teacher.py): rows made as a job, a recipe refused before anything runs (exit 2), --preview writing
nothing, and a run killed with SIGKILL then run again: no row lost, none repeated."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from tunestudio.worker.tiny_docs import write_docs

from .helpers.server import loopback_v1
from .helpers.teacher import Teacher
from .helpers.wait import wait_until

CLI = [sys.executable, "-m", "tunestudio.cli", "data", "make"]


@pytest.fixture(scope="module")
def teacher() -> Iterator[str]:
    with loopback_v1(Teacher) as url:
        yield url


def write_recipe(tmp_path: Path, url: str, **fields: Any) -> Path:
    docs = write_docs(tmp_path / "docs")
    recipe = {"sources": [str(docs["md"]), str(docs["pdf"])], "task": "qa", "rows": 4, "chunk_size": 300,
              "chunk_overlap": 50, "output": str(tmp_path / "data" / "qa.jsonl"),
              "teacher": {"base_url": url, "model": "good"}, **fields}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    return path


def env(tmp_path: Path, **more: str) -> dict[str, str]:
    return {**os.environ, "TUNESTUDIO_HOME": str(tmp_path / "home"), "TUNESTUDIO_PREWARM": "false",
            "COLUMNS": "200", **more}


def cli(tmp_path: Path, *args: str, **more: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env(tmp_path, **more), timeout=240)


def rows_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_a_recipe_runs_as_a_job_and_a_bad_one_is_refused_before_it(teacher: str, tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, teacher)
    done = cli(tmp_path, str(recipe))
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(rows_of(tmp_path / "data" / "qa.jsonl")) == 4
    assert "rows made" in done.stdout and "completed" in done.stdout
    refused = cli(tmp_path, str(write_recipe(tmp_path, teacher, task="tools")))
    assert refused.returncode == 2 and "tools: the tools task needs `tools`" in refused.stderr
    keyless = write_recipe(tmp_path, teacher, teacher={"base_url": teacher, "model": "good", "api_key_env": "NOPE"})
    refused = cli(tmp_path, str(keyless))
    assert refused.returncode == 2 and "NOPE is not set" in refused.stderr


def test_preview_prints_rows_and_writes_nothing(teacher: str, tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, teacher, output=str(tmp_path / "p" / "qa.jsonl"))
    done = cli(tmp_path, str(recipe), "--preview", "2")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("assistant") == 2 and not (tmp_path / "p").exists()


def test_a_run_killed_with_sigkill_and_run_again_loses_and_repeats_no_row(teacher: str, tmp_path: Path) -> None:
    out = tmp_path / "data" / "qa.jsonl"
    recipe = write_recipe(tmp_path, teacher, rows=30, concurrency=1,
                          teacher={"base_url": teacher, "model": "slow"})
    first = subprocess.Popen([*CLI, str(recipe)], env=env(tmp_path), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    wait_until(lambda: out.exists() and len(out.read_text().splitlines()) >= 3, 120, "three rows")
    family = [first.pid, *(p.pid for p in psutil.Process(first.pid).children(recursive=True))]
    os.kill(first.pid, signal.SIGKILL)  # the CLI and so, with it, its worker (PR_SET_PDEATHSIG)
    first.wait(30)
    wait_until(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                               for p in family), 30, "the worker's death")
    kept = rows_of(out)
    assert 3 <= len(kept) < 30
    again = write_recipe(tmp_path, teacher, rows=len(kept) + 3)
    done = cli(tmp_path, str(again))
    rows = rows_of(out)
    assert done.returncode == 0, done.stdout + done.stderr
    assert rows[:len(kept)] == kept and len(rows) == len(kept) + 3
    assert len({r["provenance"]["key"] for r in rows}) == len(rows)
