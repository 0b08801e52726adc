"""The supervisor with a real worker: crashes are classified, not hidden."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tunestudio.events import Log, Progress
from tunestudio.jobs.supervisor import Supervisor

from ..helpers import fake_workers
from ..helpers.jobs import job_config, run_job


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


def test_a_worker_deaf_to_stop_is_killed_by_the_escalation(tmp_path: Path) -> None:
    """Cancel → grace → SIGTERM (ignored) → SIGKILL: the process is gone within grace + kill bound."""
    grace, bound = 1.0, 1.0
    asked: list[float] = []

    def cancel_at_step_3(sup: Supervisor, event: object) -> None:
        if isinstance(event, Progress) and event.step == 3 and not asked:
            asked.append(time.monotonic())
            sup.cancel()

    run = run_job(job_config("org/fake", tmp_path / "out"), cancel_at_step_3, timeout=30,
                  target=fake_workers.ignores_stop, stop_grace_seconds=grace, kill_after_seconds=bound)
    took = time.monotonic() - asked[0]
    assert run.outcome.kind == "cancelled"
    assert run.outcome.message == "cancelled (worker killed by signal 9 (SIGKILL))"
    assert grace + bound <= took < grace + bound + 2.0, took


def test_malformed_events_leave_the_pump_alive(tmp_path: Path) -> None:
    run = run_job(job_config("org/fake", tmp_path / "out"), timeout=30, target=fake_workers.malformed)
    assert run.outcome.kind == "completed", run.outcome
    assert [e.step for e in run.of(Progress)] == [1, 2, 3, 4, 5]
    logs = run.of(Log)
    assert len(logs) == 1 and len(logs[0].message) == 5_000_000  # garbage and the replayed seq were skipped
