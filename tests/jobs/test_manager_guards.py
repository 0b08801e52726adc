"""What the manager refuses: output folders that would wipe, a full queue, double resumes, unsafe deletes."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tunestudio.jobs.manager import JobManager
from tunestudio.jobs.models import JobConflict, JobNotFound, QueueFull
from tunestudio.jobs.status import JobStatus
from tunestudio.paths import PathRefused
from tunestudio.settings import Settings

from ..helpers import fake_workers
from ..helpers.jobs import job_config
from ..helpers.wait import wait_until

S = JobStatus


def settings(tmp_path: Path, **overrides: object) -> Settings:
    return Settings(home=tmp_path / "home", prewarm=False, **overrides)


def test_output_folders_that_would_wipe_are_refused_before_anything_starts(tmp_path: Path) -> None:
    home = tmp_path / "home"
    manager = JobManager(settings(tmp_path), worker_target=fake_workers.instant)  # not started: nothing runs
    try:
        for bad in (home, tmp_path, home / "jobs", home / "data" / "x"):
            with pytest.raises(PathRefused) as info:
                manager.submit(job_config("org/fake", bad))
            assert info.value.field == "output_dir"
        manager.submit(job_config("org/fake", home / "outs" / "a"))
        with pytest.raises(PathRefused, match="overlaps"):  # a live (queued) job's folder
            manager.submit(job_config("org/fake", home / "outs" / "a"))
        with pytest.raises(PathRefused, match="overlaps"):  # a folder that holds it
            manager.submit(job_config("org/fake", home / "outs"))
        assert manager.count() == 1
    finally:
        manager.close()


def test_the_queue_has_a_cap(tmp_path: Path) -> None:
    manager = JobManager(settings(tmp_path, max_queued_jobs=3), worker_target=fake_workers.instant)
    try:
        for i in range(3):
            manager.submit(job_config("org/fake", tmp_path / f"o{i}"))
        with pytest.raises(QueueFull, match="3 jobs are queued"):
            manager.submit(job_config("org/fake", tmp_path / "o4"))
    finally:
        manager.close()


def _failed_with_checkpoint(manager: JobManager, tmp_path: Path) -> str:
    job = manager.submit(job_config("org/fake", tmp_path / "home" / "out"))
    wait_until(lambda: manager.get(job.id).status.is_terminal, 30, "the job to fail")
    assert manager.get(job.id).status is S.failed and manager.get(job.id).resumable
    return job.id


def test_resume_and_delete_racing_leave_one_consistent_outcome(tmp_path: Path) -> None:
    with JobManager(settings(tmp_path), worker_target=fake_workers.checkpoints_then_fails) as manager:
        job_id = _failed_with_checkpoint(manager, tmp_path)
        resumed: list[str] = []
        errors: list[BaseException] = []
        barrier = threading.Barrier(8)

        def resume() -> None:
            barrier.wait()
            try:
                resumed.append(manager.resume(job_id).id)
            except (JobConflict, JobNotFound):
                pass
            except BaseException as exc:
                errors.append(exc)

        def delete() -> None:
            barrier.wait()
            try:
                manager.delete(job_id, delete_artifacts=True)
            except (JobConflict, JobNotFound):
                pass
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=resume if i % 2 else delete) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert errors == []
        assert len(resumed) <= 1
        if resumed:  # the resume won: the parent stays, its folder with it, and it cannot resume twice
            assert manager.get(job_id).status is S.failed and (tmp_path / "home" / "out").is_dir()
            with pytest.raises(JobConflict, match="resumed already"):
                manager.resume(job_id)
            wait_until(lambda: manager.get(resumed[0]).status.is_terminal, 30, "the resumed job to end")
        else:  # the delete won: nothing is left to resume
            with pytest.raises(JobNotFound):
                manager.get(job_id)


def test_deleting_artefacts_another_job_refers_to_is_refused(tmp_path: Path) -> None:
    with JobManager(settings(tmp_path), worker_target=fake_workers.checkpoints_then_fails) as manager:
        job_id = _failed_with_checkpoint(manager, tmp_path)
        child = manager.resume(job_id)
        wait_until(lambda: manager.get(child.id).status.is_terminal, 30, "the resumed job to end")
        for artefacts in (True, False):
            with pytest.raises(JobConflict, match=f"job {child.id} was resumed from"):
                manager.delete(job_id, delete_artifacts=artefacts)
        assert (tmp_path / "home" / "out" / "checkpoint-1").is_dir() and manager.get(job_id)
        manager.delete(child.id, delete_artifacts=True)  # the child first, then the parent may go
        manager.delete(job_id, delete_artifacts=True)
        assert not (tmp_path / "home" / "out").exists()


def test_the_manager_answers_while_a_worker_starts_and_a_stop_asked_then_is_passed_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's start (a torchrun launcher, a Ray driver) may take seconds: no lock is held meanwhile, and a
    cancel asked before the process runs reaches it once it does."""
    from tunestudio.jobs.supervisor import Supervisor

    entered, gate = threading.Event(), threading.Event()
    real_start = Supervisor.start

    def slow_start(self: Supervisor) -> None:
        entered.set()
        assert gate.wait(120), "the test never opened the gate"
        real_start(self)

    monkeypatch.setattr(Supervisor, "start", slow_start)
    with JobManager(settings(tmp_path, stop_grace_seconds=1.0),
                    worker_target=fake_workers.waits_for_go) as manager:
        job = manager.submit(job_config("org/fake", tmp_path / "a"))
        assert entered.wait(60), "the scheduler never started the worker"
        answers: list[JobStatus] = []
        asker = threading.Thread(target=lambda: answers.append(manager.cancel(job.id).status), daemon=True)
        asker.start()
        asker.join(30)
        assert answers == [S.cancelling], "cancel waited for the worker's start"
        assert not gate.is_set()
        queued = manager.submit(job_config("org/fake", tmp_path / "b"))  # a submit does not wait either
        assert manager.get(queued.id).status is S.queued
        gate.set()
        final = wait_until(lambda: j if (j := manager.get(job.id)).status.is_terminal else None, 60,
                           "the cancelled job's end")
        assert final.status is S.cancelled
        # b's folder is the job's to make (a folder made before it starts is not its own): touch go once it trains
        wait_until(lambda: (manager.get(queued.id).progress or {}).get("step", 0) >= 1, 60, "the second job's steps")
        (tmp_path / "b" / "go").touch()
        other = wait_until(lambda: j if (j := manager.get(queued.id)).status.is_terminal else None, 60,
                           "the second job's end")
        assert other.status is S.completed, other.error


def test_a_job_deleted_as_its_end_is_recorded_still_frees_its_slot(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The end is recorded before the exit handler frees the slot: a client that sees the job end may delete it
    in between. The slot must still be freed (else the next job never starts) and the record forgotten."""
    with JobManager(settings(tmp_path), worker_target=fake_workers.instant) as manager:
        record_exit = manager._tracker.record_exit
        deleted: list[str] = []

        def end_then_delete(job_id: str, outcome: object) -> None:
            record_exit(job_id, outcome)  # type: ignore[arg-type]
            if not deleted:  # the first job only: a client deleting it the moment it reads "completed"
                manager.delete(job_id)
                deleted.append(job_id)

        monkeypatch.setattr(manager._tracker, "record_exit", end_then_delete)
        first = manager.submit(job_config("org/fake", tmp_path / "home" / "one"))
        wait_until(lambda: deleted == [first.id], 30, "the first job to end and be deleted")
        second = manager.submit(job_config("org/fake", tmp_path / "home" / "two"))
        wait_until(lambda: manager.get(second.id).status.is_terminal, 30, "the second job to run in the freed slot")
        assert manager.get(second.id).status is S.completed
        wait_until(lambda: first.id not in manager._jobs, 10, "the deleted job's record to be forgotten")
        with pytest.raises(JobNotFound):
            manager.get(first.id)
