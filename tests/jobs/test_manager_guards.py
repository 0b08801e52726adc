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
