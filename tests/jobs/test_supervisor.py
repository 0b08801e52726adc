"""The supervisor with a real worker: crashes are classified, not hidden."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tunestudio.events import Log, Progress, Stop
from tunestudio.jobs.executor import LocalExecutor
from tunestudio.jobs.supervisor import Supervisor
from tunestudio.process import pid_alive

from ..helpers import fake_workers
from ..helpers.jobs import job_config, run_job


def test_sigkilled_worker_is_failed_with_the_signal_named(tiny_model: Path, tmp_path: Path) -> None:
    killed: list[int] = []

    def kill_at_step_3(sup: Supervisor, event: object) -> None:
        if isinstance(event, Progress) and event.step == 3 and not killed:
            killed.append(sup.pid)
            os.kill(sup.pid, signal.SIGKILL)

    # The pump sees the death and ends the job (a hang runs into run_job's deadline).
    run = run_job(job_config(tiny_model, tmp_path / "out", max_steps=500), kill_at_step_3)
    assert run.outcome.kind == "failed"
    assert "signal 9 (SIGKILL)" in run.outcome.message
    assert not pid_alive(killed[0])  # the outcome comes once the process is gone
    assert any(s >= 3 for s, _ in run.losses)  # what was reported before the kill is kept


class Escalation:
    """An executor that records, in order, what the supervisor asked of it: commands sent and signals, each with
    the newest step the worker had reported by then."""

    def __init__(self, executor: LocalExecutor) -> None:
        self.executor = executor
        self.step = 0
        self.asked: list[tuple[str, int]] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self.executor, name)

    def send(self, command: Stop) -> None:
        self.asked.append((f"stop(save={command.save})", self.step))
        self.executor.send(command)

    def kill(self, sig: int) -> None:
        self.asked.append((signal.Signals(sig).name, self.step))
        self.executor.kill(sig)


def test_a_worker_deaf_to_stop_is_killed_by_the_escalation(tmp_path: Path) -> None:
    """Cancel → grace → SIGTERM (ignored) → SIGKILL, in that order, each after the worker went on past the one
    before: the process is gone, however long each took."""
    executor = Escalation(LocalExecutor(fake_workers.ignores_stop))

    def cancel_at_step_3(sup: Supervisor, event: object) -> None:
        if isinstance(event, Progress):
            executor.step = event.step
            if event.step == 3:
                sup.cancel()

    run = run_job(job_config("org/fake", tmp_path / "out"), cancel_at_step_3, timeout=60, executor=executor,
                  stop_grace_seconds=1.0, kill_after_seconds=1.0)
    assert run.outcome.kind == "cancelled"
    assert run.outcome.message == "cancelled (worker killed by signal 9 (SIGKILL))"
    assert [what for what, _ in executor.asked] == ["stop(save=False)", "SIGTERM", "SIGKILL"]
    # The worker (a step every 0.05 s) trained on through the grace and through the SIGTERM: each signal came
    # after the step before it was given its time, not at once.
    (_, cancelled), (_, termed), (_, killed) = executor.asked
    assert cancelled == 3 and cancelled < termed < killed, executor.asked
    assert not pid_alive(executor.pid)


def test_malformed_events_leave_the_pump_alive(tmp_path: Path) -> None:
    run = run_job(job_config("org/fake", tmp_path / "out"), timeout=30, target=fake_workers.malformed)
    assert run.outcome.kind == "completed", run.outcome
    assert [e.step for e in run.of(Progress)] == [1, 2, 3, 4, 5]
    logs = run.of(Log)
    assert len(logs) == 1 and len(logs[0].message) == 5_000_000  # garbage and the replayed seq were skipped


def test_the_worker_receives_the_typed_job_its_secret_inside(tmp_path: Path) -> None:
    """One typed hand-off (issue 39): the supervisor hands a local worker the JobConfig validated at submit, its
    secret whole, not a dict to validate again."""
    import hashlib

    cfg = job_config("org/fake", tmp_path / "out", hf_token="hf_secret_value")
    run = run_job(cfg, timeout=30, target=fake_workers.reports_its_config)
    assert run.outcome.kind == "completed", run.outcome
    digest = hashlib.sha256(b"hf_secret_value").hexdigest()[:12]
    assert [e.message for e in run.of(Log)] == [f"JobConfig org/fake token={digest}"]
