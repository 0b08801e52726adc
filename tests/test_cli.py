"""`tunestudio` on the command line, as a user runs it (a real process, a real worker)."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import yaml

from tunestudio.jobs.manager import JobManager
from tunestudio.settings import Settings

from .helpers import fake_workers
from .helpers.jobs import DATA, job_config
from .helpers.wait import wait_until

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "tunestudio.cli"]


def env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "TUNESTUDIO_HOME": str(tmp_path / "home"), "COLUMNS": "200"}


def write_job(tmp_path: Path, **fields: object) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(fields))
    return path


def test_bad_config_exits_2_with_the_field_and_starts_nothing(tmp_path: Path) -> None:
    for fields, named in (({"batch_size": 0, "lora_r": 0}, ("batch_size", "lora_r")),
                          ({"local_datasets": ["/nope.jsonl"]}, ("local_datasets", "/nope.jsonl")),
                          ({"model_name": "./models/missing"}, ("model_name", "does not exist")),
                          ({"learning_rat": 1e-4}, ("learning_rat", "did you mean `learning_rate`?"))):
        job = write_job(tmp_path, **{"model_name": "x", "local_datasets": [str(DATA / "alpaca.jsonl")], **fields})
        proc = subprocess.run([*CLI, "train", str(job)], capture_output=True, text=True, env=env(tmp_path),
                              timeout=60)
        assert proc.returncode == 2
        assert all(word in proc.stderr for word in named), proc.stderr
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
    assert "exact match" in out and "ROUGE-L" in out and "held-out rows" in out  # the evaluation table
    listing = subprocess.run([*CLI, "jobs", "list"], capture_output=True, text=True, env=env(tmp_path), timeout=60)
    assert listing.returncode == 0 and "completed" in listing.stdout
    # The job's log (the page's, `jobs logs`) holds no warning of peft reading transformers' renamed attribute,
    # and no progress bar of the libraries (one line of redraws each): this worker was spawned, tests/worker/
    # test_training.py's forked.
    [log] = (tmp_path / "home" / "jobs").glob("*/worker.log")
    text = log.read_text()
    assert "[info] model: " in text and "is_gradient_checkpointing" not in text
    assert "\r" not in text and "it/s]" not in text and "examples/s]" not in text, text[:2000]


def test_jobs_show_says_why_a_job_stopped_early_and_its_best_step(tmp_path: Path) -> None:
    with JobManager(Settings(home=tmp_path / "home"), worker_target=fake_workers.stops_early) as manager:
        job = manager.submit(job_config("org/fake", tmp_path / "out", eval_steps=5,
                                        early_stopping={"metric": "exact_match", "patience": 2}))
        wait_until(lambda: manager.get(job.id).is_terminal, 30, "the job's end")
    shown = subprocess.run([*CLI, "jobs", "show", job.id], capture_output=True, text=True, env=env(tmp_path),
                           timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"status\s+completed", shown.stdout) and "stopped early at step 20" in shown.stdout
    assert re.search(r"best\s+step 10: exact_match 0\.7500 \(the artefacts are its weights\)", shown.stdout)


def test_failed_job_exits_1(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"instruction": "a", "output": "b"}) + "\n")
    (tmp_path / "not-a-model").mkdir()  # there, so the submit takes it; the worker finds no model in it
    job = write_job(tmp_path, model_name=str(tmp_path / "not-a-model"), local_datasets=[str(data)])
    proc = subprocess.run([*CLI, "train", str(job)], capture_output=True, text=True, env=env(tmp_path), timeout=120)
    assert proc.returncode == 1
    assert "failed" in proc.stdout and "not-a-model" in proc.stdout, proc.stdout


def test_ctrl_c_once_stops_and_saves_then_resume_completes(tiny_model: Path, tmp_path: Path) -> None:
    cfg = job_config(tiny_model, tmp_path / "out", max_steps=150)
    job = write_job(tmp_path, **cfg.public_dict())
    with subprocess.Popen([*CLI, "train", str(job)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=env(tmp_path)) as proc:
        # Wait for training (read the store the way any reader would), then press Ctrl-C.
        _wait_for_status(tmp_path / "home" / "tunestudio.db", "training", 180)
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, output[-3000:]
    assert "stopped" in output and "tunestudio jobs resume" in output
    job_id = output.split("tunestudio jobs resume ")[1].split()[0]
    resumed = subprocess.run([*CLI, "jobs", "resume", job_id], capture_output=True, text=True, env=env(tmp_path),
                             timeout=240)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert "completed" in resumed.stdout


def _wait_for_status(db: Path, wanted: str, timeout: float) -> str:
    """The id of the first job with status `wanted`, read the way any other process would."""

    def find() -> str | None:
        if not db.exists():
            return None
        try:
            with sqlite3.connect(db) as conn:
                row = conn.execute("SELECT id FROM jobs WHERE status = ?", (wanted,)).fetchone()
        except sqlite3.OperationalError:
            return None  # the other process is still creating its tables
        return row[0] if row else None

    return wait_until(find, timeout, f"a job to become {wanted}", every=0.1)


def test_jobs_stop_reaches_a_run_in_another_process(tiny_model: Path, tmp_path: Path) -> None:
    cfg = job_config(tiny_model, tmp_path / "out", max_steps=2000)
    job = write_job(tmp_path, **cfg.public_dict())
    with subprocess.Popen([*CLI, "train", str(job)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=env(tmp_path)) as proc:
        job_id = _wait_for_status(tmp_path / "home" / "tunestudio.db", "training", 180)
        stop = subprocess.run([*CLI, "jobs", "stop", job_id], capture_output=True, text=True, env=env(tmp_path),
                              timeout=180)
        output, _ = proc.communicate(timeout=120)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    # The owner took it within its poll, as a local stop (the tiny model may even have saved already).
    assert re.search(rf"stop asked for job {job_id} \((stopping|saving|stopped)\)", stop.stdout), stop.stdout
    assert f"job {job_id}: stopped" in stop.stdout and f"tunestudio jobs resume {job_id}" in stop.stdout
    assert proc.returncode == 0 and "stopped and saved" in output, output[-3000:]
    shown = subprocess.run([*CLI, "jobs", "show", job_id], capture_output=True, text=True, env=env(tmp_path),
                           timeout=60)
    assert "checkpoint-" in shown.stdout and re.search(r"resumable\s+yes", shown.stdout)
    again = subprocess.run([*CLI, "jobs", "stop", job_id], capture_output=True, text=True, env=env(tmp_path),
                           timeout=60)
    assert again.returncode == 2 and "only a live job can be stopped" in again.stderr


def test_jobs_stop_of_a_job_whose_process_died_says_so(tmp_path: Path) -> None:
    db = tmp_path / "home" / "tunestudio.db"
    db.parent.mkdir(parents=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    with sqlite3.connect(db) as conn:  # what a killed server leaves behind (the schema comes from the store)
        subprocess.run([*CLI, "jobs", "list"], env=env(tmp_path), check=True, capture_output=True, timeout=60)
        conn.execute("INSERT INTO jobs (id, status, config, created_at, owner_pid) "
                     "VALUES ('j1', 'training', '{}', 1, ?)", (int(dead.stdout),))
    result = subprocess.run([*CLI, "jobs", "stop", "j1"], capture_output=True, text=True, env=env(tmp_path),
                            timeout=60)
    assert result.returncode == 2
    assert "gone" in result.stderr and "interrupted" in result.stderr


def _commands(tmp_path: Path) -> list[list[str]]:
    job = write_job(tmp_path, model_name="org/fake", local_datasets=[str(REPO / "examples" / "data" / "alpaca.jsonl")])
    return [["serve", "--port", "1"], ["train", str(job)], ["jobs", "list"], ["jobs", "show", "x"]]


def _one_line_exit_2(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr  # one line: what, where, what to do
    for word in words:
        assert word in lines[0], (word, lines[0])


def test_a_corrupt_database_is_one_clear_line_and_left_untouched(tmp_path: Path) -> None:
    import hashlib

    home = tmp_path / "home"
    home.mkdir()
    db = home / "tunestudio.db"
    db.write_bytes(b"this is not a database, but someone's notes\n" * 500)
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    for command in _commands(tmp_path):
        proc = subprocess.run([*CLI, *command], capture_output=True, text=True, env=env(tmp_path), timeout=60)
        _one_line_exit_2(proc, str(db), "not a valid SQLite database", "move it aside")
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


def test_a_read_only_data_directory_is_one_clear_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    subprocess.run([*CLI, "jobs", "list"], env=env(tmp_path), check=True, capture_output=True, timeout=60)
    if os.geteuid() == 0:
        # Root writes through file modes, so make the folder really read-only: a read-only bind mount of it,
        # in a mount namespace of the command's own.
        script = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
        wrap = ["unshare", "-m", "sh", "-c", script, str(home)]
    else:
        home.chmod(0o555)
        wrap = []
    try:
        for command in _commands(tmp_path):
            proc = subprocess.run([*wrap, *CLI, *command], capture_output=True, text=True, env=env(tmp_path),
                                  timeout=60)
            _one_line_exit_2(proc, str(home), "not writable", "TUNESTUDIO_HOME")
    finally:
        home.chmod(0o755)
