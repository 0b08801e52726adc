"""`tunestudio data inspect` as a user runs it (a real process, a real child): the report in the terminal, and
--json, which is the API's answer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tunestudio.api import create_app
from tunestudio.settings import Settings

from .helpers.planted import MAX_SEQ_LENGTH, Planted, write_planted

CLI = [sys.executable, "-m", "tunestudio.cli", "data", "inspect"]


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TUNESTUDIO_HOME": str(tmp_path / "home"), "COLUMNS": "200"}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=240)


@pytest.fixture
def planted(tmp_path: Path) -> Planted:
    return write_planted(tmp_path)


@pytest.mark.timeout(300)
def test_json_is_the_same_object_the_api_answers(planted: Planted, tiny_model: Path, tmp_path: Path) -> None:
    args = [str(planted.train), "--model", str(tiny_model), "--max-seq-length", str(MAX_SEQ_LENGTH),
            "--eval", str(planted.eval), "--dedupe", "exact"]
    proc = run(tmp_path, *args, "--json")
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)  # one JSON object, nothing else on stdout
    settings = Settings(home=tmp_path / "home", dataset_roots=[tmp_path], model_roots=[tiny_model.parent])
    with TestClient(create_app(settings), base_url="http://127.0.0.1:8765") as client:
        answer = client.post("/api/datasets/report", json={
            "local_datasets": [str(planted.train)], "model_name": str(tiny_model), "max_seq_length": MAX_SEQ_LENGTH,
            "eval_split": str(planted.eval), "dedupe": "exact"})
    assert answer.status_code == 200, answer.text
    served = answer.json()
    assert printed.pop("seconds") >= 0 and served.pop("seconds") >= 0  # the time it took differs
    assert printed == served
    assert (printed["duplicates"]["exact"], printed["duplicates"]["removed"]) == (len(planted.exact),
                                                                                  len(planted.exact))


@pytest.mark.timeout(300)
def test_the_terminal_report_names_the_faults(planted: Planted, tiny_model: Path, tmp_path: Path) -> None:
    proc = run(tmp_path, str(planted.train), "--model", str(tiny_model), "--max-seq-length", str(MAX_SEQ_LENGTH),
               "--held-out")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"rows: {planted.usable + len(planted.refused)} read, {planted.usable} usable, 3 refused" in out
    assert "train.jsonl:48 is not valid JSON" in out and "train.jsonl:50 has a prompt of" in out
    assert f"duplicates: {len(planted.exact)} exact" in out and f"{len(planted.near)} near" in out
    assert f"max_seq_length {MAX_SEQ_LENGTH} cuts {len(planted.long)} rows" in out
    assert "eval overlap: 16 eval rows (held-out split: 16 of 47 rows, seed 3407" in out


def test_bad_arguments_exit_2_and_an_unreadable_dataset_exits_1(tmp_path: Path) -> None:
    missing = run(tmp_path, str(tmp_path / "nope.jsonl"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    bad = run(tmp_path, str(tmp_path), "--dedupe", "fuzzy")
    assert bad.returncode == 2 and "dedupe" in bad.stderr
    odd = tmp_path / "odd.jsonl"
    odd.write_text('{"question": "q", "answer": "a"}\n')
    unreadable = run(tmp_path, str(odd))
    assert unreadable.returncode == 1 and "not a format tunestudio knows" in unreadable.stderr
