"""`tunestudio jobs show` names a job's held-out rows and `tunestudio jobs rows` lists them worst first (a scripted
worker writes the files a real one writes; tests/api/test_eval_rows.py runs a real one)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tunestudio.events import EVAL_ROWS_FILE, HELD_OUT_FILE
from tunestudio.jobs.manager import JobManager
from tunestudio.jobs.status import JobStatus
from tunestudio.settings import Settings
from tunestudio.worker import child
from tunestudio.worker.child import WorkerArgs

from .helpers.jobs import job_config
from .helpers.wait import wait_until

CLI = [sys.executable, "-m", "tunestudio.cli"]
ROWS = [{"index": i, "file": "/data/train.jsonl", "line": 10 + i, "prompt": f"prompt {i}", "reference": f"ref {i}",
         "loss": loss, "loss_before": 4.0, "answer": f"answer {i}", "answer_before": "base", "rouge_l": score}
        for i, (loss, score) in enumerate([(0.5, 1.0), (2.5, 0.0), (1.5, 0.5)])]


def evaluated(args: WorkerArgs) -> None:
    """Completes with an evaluation whose rows it wrote, as worker/main.py does."""
    child.become_worker(dataclasses.replace(args, log_path=None))
    output = Path(args.public_config["output_dir"])
    (output / HELD_OUT_FILE).write_text(json.dumps({"version": 1, "rows": []}))
    (output / EVAL_ROWS_FILE).write_text(json.dumps({"loss": "per token", "metrics": ["rouge_l"], "rows": ROWS}))
    args.events.put(json.dumps({"kind": "phase", "seq": 1, "ts": time.time(), "phase": "training"}))
    event = {"kind": "completed", "seq": 2, "ts": time.time(), "output_dir": str(output), "global_step": 1,
             "evaluation": {"rows": 3, "rows_file": str(output / EVAL_ROWS_FILE), "scored_rows": 3},
             "held_out": {"file": str(output / HELD_OUT_FILE), "rows": 3, "seed": 7, "source": None}}
    args.events.put(json.dumps(event))
    args.events.close()
    args.events.join_thread()


def test_jobs_show_names_the_held_out_rows_and_jobs_rows_lists_them_worst_first(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with JobManager(Settings(home=home), worker_target=evaluated) as manager:
        job = manager.submit(job_config("org/fake", tmp_path / "out", eval_steps=5))
        wait_until(lambda: manager.get(job.id).status.is_terminal, 60, "the job's end")
        assert manager.get(job.id).status is JobStatus.completed
    env = {**os.environ, "TUNESTUDIO_HOME": str(home), "COLUMNS": "200"}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CLI, "jobs", *args], capture_output=True, text=True, env=env, timeout=60)

    shown = cli("show", job.id)
    assert shown.returncode == 0, shown.stderr
    assert f"3 rows, seed 7: {tmp_path / 'out' / HELD_OUT_FILE}" in shown.stdout

    worst = cli("rows", job.id)
    assert worst.returncode == 0, worst.stderr
    lines = [line for line in worst.stdout.splitlines() if "train.jsonl:" in line]
    assert [line.split()[1] for line in lines] == ["train.jsonl:11", "train.jsonl:12", "train.jsonl:10"]
    assert "4.000 → 2.500" in lines[0] and "ref 1" in lines[0] and "answer 1" in lines[0]
    assert "rows 1–3 of 3, worst loss first; loss: per token" in worst.stdout

    best_rouge = cli("rows", job.id, "--by", "rouge_l", "--order", "best", "--limit", "1")
    assert [line.split()[1] for line in best_rouge.stdout.splitlines() if "train.jsonl:" in line] == [
        "train.jsonl:10"]
    assert "rows 1–1 of 3, best rouge_l first" in best_rouge.stdout

    missing = cli("rows", "nope")
    assert missing.returncode == 2 and "nope" in missing.stderr
    wrong = cli("rows", job.id, "--by", "speed")
    assert wrong.returncode == 2 and "--by one of loss, exact_match, token_f1, rouge_l" in wrong.stderr
