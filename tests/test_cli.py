"""`tunestudio` on the command line, as a user runs it (a real process, a real worker)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import yaml

from .helpers.jobs import job_config

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "tunestudio.cli"]


def env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "TUNESTUDIO_HOME": str(tmp_path / "home"), "COLUMNS": "200"}


def write_job(tmp_path: Path, **fields: object) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(fields))
    return path


def test_bad_config_exits_2_with_the_field_and_starts_nothing(tmp_path: Path) -> None:
    job = write_job(tmp_path, model_name="x", local_datasets=["/nope.jsonl"], batch_size=0)
    proc = subprocess.run([*CLI, "train", str(job)], capture_output=True, text=True, env=env(tmp_path), timeout=60)
    assert proc.returncode == 2
    assert "batch_size" in proc.stderr and "local_datasets" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not (tmp_path / "home" / "jobs").exists()


def test_train_prints_the_summary_and_jobs_list_shows_it(tiny_model: Path, tmp_path: Path) -> None:
    cfg = job_config(tiny_model, tmp_path / "out", max_steps=12, eval_steps=0.5,
                     sample_prompts=["Repeat the word three times.\n\ncat"])
    job = write_job(tmp_path, **cfg.public_dict())
    proc = subprocess.run([*CLI, "train", str(job)], capture_output=True, text=True, env=env(tmp_path), timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "completed" in out and str(tmp_path / "out") in out
    assert "train loss" in out and "eval loss" in out and "(step 0)" in out
    assert "base model" in out and "fine-tuned" in out
    listing = subprocess.run([*CLI, "jobs", "list"], capture_output=True, text=True, env=env(tmp_path), timeout=60)
    assert listing.returncode == 0 and "completed" in listing.stdout


def test_failed_job_exits_1(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"instruction": "a", "output": "b"}) + "\n")
    job = write_job(tmp_path, model_name=str(tmp_path / "missing-model"), local_datasets=[str(data)])
    proc = subprocess.run([*CLI, "train", str(job)], capture_output=True, text=True, env=env(tmp_path), timeout=120)
    assert proc.returncode == 1
    assert "missing-model" in proc.stdout and "does not exist" in proc.stdout


def test_ctrl_c_once_stops_and_saves_then_resume_completes(tiny_model: Path, tmp_path: Path) -> None:
    cfg = job_config(tiny_model, tmp_path / "out", max_steps=150)
    job = write_job(tmp_path, **cfg.public_dict())
    with subprocess.Popen([*CLI, "train", str(job)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=env(tmp_path)) as proc:
        deadline = time.monotonic() + 180
        db = tmp_path / "home" / "tunestudio.db"
        # Wait for training (read the store the way any reader would), then press Ctrl-C.
        while time.monotonic() < deadline:
            if db.exists():
                try:
                    with sqlite3.connect(db) as conn:
                        row = conn.execute("SELECT status FROM jobs").fetchone()
                except sqlite3.OperationalError:
                    row = None  # the CLI is still creating its tables
                if row and row[0] == "training":
                    break
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, output[-3000:]
    assert "stopped" in output and "tunestudio jobs resume" in output
    job_id = output.split("tunestudio jobs resume ")[1].split()[0]
    resumed = subprocess.run([*CLI, "jobs", "resume", job_id], capture_output=True, text=True, env=env(tmp_path),
                             timeout=240)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert "completed" in resumed.stdout
