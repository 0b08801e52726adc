"""`tunestudio train` with a training method beyond SFT: its main metric in the bar and the summary."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from .helpers.jobs import DATA, job_config
from .test_cli import CLI, env


def test_train_shows_the_methods_main_metric(tiny_model: Path, tmp_path: Path) -> None:
    cfg = job_config(tiny_model, tmp_path / "out", method="dpo", local_datasets=[str(DATA / "preference.jsonl")],
                     max_steps=3, batch_size=4, max_seq_length=64, learning_rate=1e-3)
    job = tmp_path / "dpo.yaml"
    job.write_text(yaml.safe_dump(cfg.public_dict()))
    proc = subprocess.run([*CLI, "train", str(job)], capture_output=True, text=True, env=env(tmp_path), timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert f"dpo (lora) of {tiny_model}" in out
    assert "read as preference (auto-detected)" in out
    # The summary: the margin starts at 0 (policy = reference).
    assert re.search(r"rewards/margins +0\.0000 \(step 1\) → -?\d\.\d{4} \(step 3\)", out), out[-2000:]
