"""The manager with real workers (and scripted ones for edge cases), a real SQLite store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tunestudio.jobs.manager import JobManager
from tunestudio.jobs.models import Job, JobEvent
from tunestudio.jobs.status import JobStatus
from tunestudio.jobs.store import Store
from tunestudio.settings import Settings

from ..helpers import fake_workers
from ..helpers.jobs import job_config
from ..helpers.wait import wait_until

REPO = Path(__file__).resolve().parents[2]
S = JobStatus


def settings(tmp_path: Path, **overrides: object) -> Settings:
    return Settings(home=tmp_path / "home", **overrides)


def wait_end(manager: JobManager, job_id: str, timeout: float = 180) -> Job:
    wait_until(lambda: manager.get(job_id).status.is_terminal, timeout, f"job {job_id} to end")
    return manager.get(job_id)


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie still answers kill(0); it holds no memory. Reap it if it is ours.
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == pid
    except ChildProcessError:
        return Path(f"/proc/{pid}/status").exists() is False or "zombie" in Path(f"/proc/{pid}/status").read_text()


def test_parent_process_never_imports_the_heavy_stack(tiny_model: Path, tmp_path: Path) -> None:
    cfg = job_config(tiny_model, tmp_path / "out", max_steps=3)
    script = f"""
import sys, json
import tunestudio.jobs, tunestudio.cli
from tunestudio.config import JobConfig
from tunestudio.jobs.manager import JobManager
from tunestudio.settings import Settings
from pathlib import Path
with JobManager(Settings(home=Path({str(tmp_path / 'home')!r}))) as manager:
    job = manager.submit(JobConfig.model_validate(json.loads({json.dumps(cfg.public_dict())!r})))
    with manager.subscribe(job.id) as stream:
        while not (event := stream.get(timeout=120)).is_end:
            pass
    print(manager.get(job.id).status.value)
print(",".join(m for m in ("torch", "transformers", "peft", "trl", "datasets", "bitsandbytes") if m in sys.modules))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    status, heavy = proc.stdout.split("\n")[-3:-1]
    assert status == "completed"
    assert heavy == ""


def test_sigkill_of_the_worker_fails_the_job_fast_and_keeps_its_metrics(tiny_model: Path, tmp_path: Path) -> None:
    with JobManager(settings(tmp_path)) as manager:
        job = manager.submit(job_config(tiny_model, tmp_path / "out", max_steps=500))
        wait_until(lambda: (manager.get(job.id).progress or {}).get("step", 0) >= 3, 120, "training to start")
        pid = manager.get(job.id).worker_pid
        os.kill(pid, signal.SIGKILL)
        # Failed by the death, without waiting for anything else (a hang runs into wait_end's deadline) ...
        final = wait_end(manager, job.id)
        assert pid_gone(pid)  # ... and only once the process is gone
        assert final.status is S.failed
        assert "signal 9 (SIGKILL)" in (final.error or "")
        steps = [r["step"] for r in manager.metrics(job.id)]
        assert steps and max(steps) >= 3
        kinds = [e.kind for e in manager.subscribe(job.id).replay]
        assert kinds.count("failed") == 1 and kinds[-1] == "status"
        # The manager is unharmed: the next job runs.
        again = manager.submit(job_config(tiny_model, tmp_path / "out2", max_steps=2))
        assert wait_end(manager, again.id).status is S.completed


def test_jobs_queue_in_order_and_a_cancelled_queued_job_never_starts(tiny_model: Path, tmp_path: Path) -> None:
    with JobManager(settings(tmp_path)) as manager:
        first = manager.submit(job_config(tiny_model, tmp_path / "a", max_steps=8))
        second = manager.submit(job_config(tiny_model, tmp_path / "b", max_steps=8))
        third = manager.submit(job_config(tiny_model, tmp_path / "c", max_steps=8))
        assert manager.get(second.id).status is S.queued  # queued, not refused
        assert manager.cancel(third.id).status is S.cancelled
        a, b = wait_end(manager, first.id), wait_end(manager, second.id)
        assert a.status is S.completed and b.status is S.completed
        assert b.started_at >= a.finished_at
        c = manager.get(third.id)
        assert c.status is S.cancelled and c.started_at is None
        assert not (tmp_path / "c").exists()


def test_concurrent_submissions_are_all_recorded_once(tmp_path: Path) -> None:
    with JobManager(settings(tmp_path), worker_target=fake_workers.instant) as manager:
        cfg = job_config("org/fake", tmp_path / "out")
        ids: list[str] = []
        lock = threading.Lock()

        def submit(i: int) -> None:
            job = manager.submit(job_config("org/fake", tmp_path / f"out-{i}"), request_id=f"req-{i}")
            with lock:
                ids.append(job.id)

        threads = [threading.Thread(target=submit, args=(i,)) for i in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(ids) == 20 and len(set(ids)) == 20
        assert manager.count() == 20
        again = manager.submit(cfg, request_id="req-7")
        assert manager.get(again.id).request_id == "req-7" and manager.count() == 20
        dup_ids: list[str] = []
        dups = [threading.Thread(target=lambda: dup_ids.append(manager.submit(cfg, request_id="same").id))
                for _ in range(5)]
        for t in dups:
            t.start()
        for t in dups:
            t.join(30)
        assert len(set(dup_ids)) == 1 and manager.count() == 21
        for job_id in {*ids, *dup_ids}:
            assert wait_end(manager, job_id, timeout=60).status is S.completed


def test_secrets_reach_no_database_log_or_artefact(tiny_model: Path, tmp_path: Path) -> None:
    hf, wandb = "hf_SeCrEt_0123456789", "wandb_SeCrEt_9876543210"
    with JobManager(settings(tmp_path)) as manager:
        job = manager.submit(job_config(tiny_model, tmp_path / "home" / "out", max_steps=3, hf_token=hf,
                                        wandb_token=wandb))
        assert wait_end(manager, job.id).status is S.completed
        manager.flush()
        blobs = [p for p in (tmp_path / "home").rglob("*") if p.is_file()]
        assert any(p.name.startswith("tunestudio.db") for p in blobs) and any(p.suffix == ".log" for p in blobs)
        for path in blobs:
            data = path.read_bytes()
            assert b"SeCrEt" not in data, path


def test_restart_marks_live_jobs_interrupted_and_resume_continues(tiny_model: Path, tmp_path: Path) -> None:
    cfg = job_config(tiny_model, tmp_path / "home" / "out", max_steps=40, save_steps=5)
    config_file = tmp_path / "job.json"
    config_file.write_text(json.dumps(cfg.public_dict()))
    worker_pid = job_id = None
    with subprocess.Popen([sys.executable, "-m", "tests.helpers.manager_proc", str(tmp_path / "home"),
                           str(config_file)], cwd=REPO, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                item = json.loads(line)
                job_id = item.get("job_id", job_id)
                worker_pid = item.get("worker_pid", worker_pid)
                if item.get("kind") == "progress" and item.get("step", 0) >= 12:
                    break
            os.kill(proc.pid, signal.SIGKILL)  # the whole manager process dies at once
        finally:
            proc.kill()
    assert worker_pid and job_id
    wait_until(lambda: pid_gone(worker_pid), 2.0, "the orphaned worker to die with its parent")

    with JobManager(settings(tmp_path)) as manager:
        job = manager.get(job_id)
        assert job.status is S.interrupted and job.resumable
        saved_step = int(Path(job.checkpoint).name.split("-")[1])
        assert saved_step >= 10
        resumed = manager.resume(job_id)
        assert resumed.resumed_from == job_id
        final = wait_end(manager, resumed.id)
        assert final.status is S.completed, final.error
        steps = [r["step"] for r in manager.metrics(resumed.id) if r["loss"] is not None]
        assert steps[0] == saved_step + 1 and steps[-1] == 40


def test_subscribe_replays_then_follows_without_gaps(tmp_path: Path) -> None:
    with JobManager(settings(tmp_path), worker_target=fake_workers.flood) as manager:
        job = manager.submit(job_config("org/fake", tmp_path / "out", max_steps=3000))
        wait_until(lambda: (manager.get(job.id).progress or {}).get("step", 0) >= 200, 30, "some progress")
        got: list[JobEvent] = []
        with manager.subscribe(job.id, after_seq=5) as stream:
            while True:
                event = stream.get(timeout=30)
                assert event is not None
                got.append(event)
                if event.is_end:
                    break
        seqs = [e.seq for e in got]
        assert seqs == list(range(6, seqs[-1] + 1))
        assert manager.get(job.id).last_seq == seqs[-1]
        view = manager.metrics(job.id, max_points=100)
        assert len(view) <= 100 and view[0]["step"] == 1 and view[-1]["step"] == 3000
        assert [r["step"] for r in manager.metrics(job.id, since_step=2990)] == list(range(2991, 3001))


def test_a_replay_gives_back_exactly_the_live_stream(tmp_path: Path) -> None:
    """Progress events are stored once, as metrics rows; a replay rebuilds them as they were sent live."""
    with JobManager(settings(tmp_path), worker_target=fake_workers.flood) as manager:
        job = manager.submit(job_config("org/fake", tmp_path / "out", max_steps=2000))
        live: list[JobEvent] = []
        with manager.subscribe(job.id) as stream:
            while not live or not live[-1].is_end:
                event = stream.get(timeout=30)
                assert event is not None, "the live stream stalled"
                live.append(event)
        with manager.subscribe(job.id) as again:
            replayed = list(again.replay)
    assert [e.seq for e in live] == list(range(1, len(live) + 1))
    assert sum(e.kind == "progress" for e in live) == 2000
    assert [(e.seq, e.kind, e.data) for e in replayed] == [(e.seq, e.kind, e.data) for e in live]
    assert [json.loads(e.text) for e in replayed] == [json.loads(e.text) for e in live]


def test_a_job_another_manager_runs_is_followed_through_the_store(tmp_path: Path) -> None:
    """A server beside a `tunestudio train` run: its stream goes on live, from the store, to the final status."""
    with JobManager(settings(tmp_path, stop_grace_seconds=0.5, kill_after_seconds=0.5),
                    worker_target=fake_workers.ignores_stop) as runner:
        job = runner.submit(job_config("org/fake", tmp_path / "out"))
        wait_until(lambda: (runner.get(job.id).progress or {}).get("step", 0) >= 3, 30, "some progress")
        watcher = JobManager(settings(tmp_path))  # not started: it runs nothing, it only reads
        with watcher.subscribe(job.id) as stream:
            replayed = list(stream.replay)
            live = [stream.get(timeout=10) for _ in range(5)]
            assert all(e is not None and e.kind == "progress" for e in live), live
            runner.cancel(job.id)
            rest = []
            while not rest or not rest[-1].is_end:
                event = stream.get(timeout=15)
                assert event is not None, "the stream stalled before the final status"
                rest.append(event)
        watcher.close()
    seqs = [e.seq for e in [*replayed, *live, *rest]]
    assert seqs == list(range(1, seqs[-1] + 1))
    assert rest[-1].data["status"] == "cancelled"


def test_metric_views_stay_within_their_memory_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tunestudio.jobs import views

    monkeypatch.setattr(views, "VIEW_RECORDS", 12)
    with JobManager(settings(tmp_path), worker_target=fake_workers.flood) as manager:
        job = manager.submit(job_config("org/fake", tmp_path / "out", max_steps=30))
        wait_end(manager, job.id, timeout=60)
        for points in range(2, 9):
            view = manager.metrics(job.id, max_points=points)
            assert len(view) <= points and view[0]["step"] == 1 and view[-1]["step"] == 30
        count, held = manager.views.held()
        assert held <= 12 and count < 7
        assert len(manager.metrics(job.id)) == 30  # bigger than the bound: kept alone, as the newest
        assert manager.views.keys() == [(job.id, None, None)]


def test_two_processes_on_one_data_directory_share_its_slots(tmp_path: Path) -> None:
    """A server and a CLI run beside it never run more jobs together than max_concurrent_jobs (one GPU, one job)."""
    config_file = tmp_path / "busy.json"
    config_file.write_text(json.dumps(job_config("org/fake", tmp_path / "busy").public_dict()))
    env = {**os.environ, "TUNESTUDIO_STOP_GRACE_SECONDS": "0.5", "TUNESTUDIO_KILL_AFTER_SECONDS": "0.5"}
    with subprocess.Popen([sys.executable, "-m", "tests.helpers.manager_proc", str(tmp_path / "home"),
                           str(config_file), "ignores_stop"], cwd=REPO, stdout=subprocess.PIPE, text=True,
                          env=env) as other:
        try:
            assert other.stdout is not None
            busy = json.loads(other.stdout.readline())["job_id"]
            for line in other.stdout:  # the other process's job holds the one slot
                if json.loads(line).get("status") == "training":
                    break
            with JobManager(settings(tmp_path), worker_target=fake_workers.instant) as manager:
                waiting = manager.submit(job_config("org/fake", tmp_path / "waiting"))
                wait_until(lambda: manager.get(waiting.id).message.startswith("waiting: another process"), 10,
                         "the second job to say why it waits")
                assert manager.get(waiting.id).status is S.queued and manager.get(waiting.id).started_at is None
                assert manager.cancel(busy).status is S.cancelling  # taken by the other process, which owns it
                assert wait_end(manager, waiting.id, timeout=30).status is S.completed
                assert manager.get(busy).status is S.cancelled
                assert manager.get(waiting.id).started_at >= manager.get(busy).finished_at
                logs = [e.data["message"] for e in manager.subscribe(waiting.id).replay if e.kind == "log"]
                assert len([m for m in logs if m.startswith("waiting:")]) == 1
            other.wait(30)
        finally:
            other.kill()


def test_a_job_queued_earlier_by_another_process_goes_first(tmp_path: Path) -> None:
    """First come, first served across processes: a free slot is left to the oldest queued job on the directory."""
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) as other:  # a live owner
        try:
            with JobManager(settings(tmp_path), worker_target=fake_workers.instant) as manager:
                store = Store(tmp_path / "home" / "tunestudio.db")  # another process's queued job, as it wrote it
                store.insert_job({"id": "elsewhere", "status": "queued", "config": {}, "created_at": 1.0,
                                  "owner_pid": other.pid})
                mine = manager.submit(job_config("org/fake", tmp_path / "out"))
                wait_until(lambda: manager.get(mine.id).message.startswith("waiting:"), 10, "the job to defer")
                assert manager.get(mine.id).status is S.queued
                store.update_job("elsewhere", wait=True, status="cancelled")  # the other one is gone
                store.close()
                assert wait_end(manager, mine.id, timeout=30).status is S.completed
        finally:
            other.kill()


def test_queued_jobs_survive_a_restart(tmp_path: Path) -> None:
    cfg = job_config("org/fake", tmp_path / "out")
    first = JobManager(settings(tmp_path), worker_target=fake_workers.instant)  # never started: nothing runs
    job = first.submit(cfg)
    first.close()
    with JobManager(settings(tmp_path), worker_target=fake_workers.instant) as manager:
        assert wait_end(manager, job.id, timeout=30).status is S.completed


@pytest.mark.parametrize("save", [True, False])
def test_stopping_one_job_leaves_the_other_alone(tmp_path: Path, save: bool) -> None:
    with JobManager(settings(tmp_path, max_concurrent_jobs=2, stop_grace_seconds=1, save_grace_seconds=1,
                             kill_after_seconds=1),
                    worker_target=fake_workers.ignores_stop) as manager:
        a = manager.submit(job_config("org/fake", tmp_path / "a"))
        b = manager.submit(job_config("org/fake", tmp_path / "b"))
        wait_until(lambda: all(manager.get(j.id).status is S.training for j in (a, b)), 30, "both to train")
        manager.stop(a.id, save=save)
        wait_end(manager, a.id, timeout=10)
        assert manager.get(b.id).status is S.training
        manager.cancel(b.id)
        wait_end(manager, b.id, timeout=10)
