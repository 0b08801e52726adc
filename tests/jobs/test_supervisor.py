"""The supervisor with a real worker: crashes are classified, not hidden."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tunestudio.events import Progress
from tunestudio.jobs.supervisor import Supervisor, describe_exit

from ..helpers.jobs import job_config, run_job


def test_describe_exit() -> None:
    assert describe_exit(-9) == "worker killed by signal 9 (SIGKILL) — possibly out of memory"
    assert describe_exit(-15) == "worker killed by signal 15 (SIGTERM)"
    assert describe_exit(1) == "worker exited with code 1"


def test_sigkilled_worker_is_failed_with_the_signal_named(tiny_model: Path, tmp_path: Path) -> None:
    killed_at: list[float] = []

    def kill_at_step_3(sup: Supervisor, event: object) -> None:
        if isinstance(event, Progress) and event.step == 3 and not killed_at:
            killed_at.append(time.monotonic())
            os.kill(sup.pid, signal.SIGKILL)

    run = run_job(job_config(tiny_model, tmp_path / "out", max_steps=500), kill_at_step_3)
    ended = time.monotonic()
    assert run.outcome.kind == "failed"
    assert "signal 9 (SIGKILL)" in run.outcome.message
    assert ended - killed_at[0] < 2.0
    assert any(s >= 3 for s, _ in run.losses)  # what was reported before the kill is kept
