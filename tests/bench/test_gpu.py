"""bench/gpu.py, the one-run GPU script: without CUDA it says so; its code runs, on this CPU, as a smoke."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_script(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # a CPU here even on a machine with a GPU
    return subprocess.run([sys.executable, "bench/gpu.py", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_without_cuda_it_says_so_in_one_line_and_succeeds() -> None:
    proc = run_script(timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("bench/gpu.py: no CUDA device visible to torch "), lines
    assert "nothing measured" in lines[0]


@pytest.mark.slow
@pytest.mark.schedule_first
@pytest.mark.timeout(400)
def test_cpu_smoke_runs_every_check_through_the_real_worker() -> None:
    """Tiny models, a few steps: the plumbing, not the figures (a CPU's speeds say nothing of a GPU's)."""
    proc = run_script("--cpu-smoke", timeout=360)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    checks = result["checks"]
    assert result["bench"] == "gpu" and result["smoke"] is True
    assert set(checks) == {"hardware", "model", "qlora", "precision", "memory", "oom"}
    assert not [name for name, check in checks.items() if "error" in check], checks
    qlora = checks["qlora"]
    assert qlora["outcome"] == "completed" and qlora["steps"] == 4 and qlora["four_bit_layers"] > 0, qlora
    for precision in ("fp32", "bf16", "auto"):
        job = checks["precision"][precision]
        assert job["outcome"] == "cancelled" and job["steps"] >= 3 and job["steady_tokens_per_s"], job
    assert checks["precision"]["auto"]["decision"].startswith("precision auto → "), checks["precision"]
    assert checks["memory"]["ok"], checks["memory"]
    oom = checks["oom"]
    assert oom["ok"] and oom["message"].startswith("out of memory: "), oom
    assert "can't allocate memory" in oom["failed_at"][-1], oom
