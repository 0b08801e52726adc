"""The public face of jobs: submit, export, stop, cancel, resume, delete, get, list, metrics, subscribe.

Routes and the CLI call this and nothing deeper. The manager composes the
parts of `jobs/`: the store (SQLite), the tracker of its own jobs' status
(`tracker.py`), the streams (numbering, fan-out, replay: `stream.py`), the
metric views (`views.py`), the other processes on the data directory
(`owners.py`, `slots.py`) and one supervisor per running job. It
owns the queue (FIFO, `max_concurrent_jobs` slots shared with every process
on the data directory) and the recovery of jobs a dead process left behind.
Every status change goes through `status.transition`.

Threads: callers (any thread), one scheduler thread that starts workers (it
lives as long as the manager, because a worker's PR_SET_PDEATHSIG fires when
the *thread* that started it ends), and each supervisor's pump thread, which
calls `tracker.on_events` (one burst of the worker's events at a time) and `_on_exit`.
Locks: `_lock` (the queue, the running set, the live jobs) is taken before a
job's `feed.lock` (its status and stream), never after.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path

from tunestudio import ownership, paths
from tunestudio.checkpoints import latest_checkpoint
from tunestudio.config import JobConfig
from tunestudio.events import Log, StatusEvent, WarningEvent
from tunestudio.export_config import ExportConfig, ExportOptions
from tunestudio.jobs import prewarm
from tunestudio.jobs.executor import executor_for
from tunestudio.jobs.models import Job, JobConflict, JobEvent, JobNotFound, QueueFull
from tunestudio.jobs.owners import Owners
from tunestudio.jobs.slots import Slots
from tunestudio.jobs.status import RESUMABLE, JobStatus, can_transition
from tunestudio.jobs.store import DuplicateRequest, Store
from tunestudio.jobs.stream import Streams, Subscription
from tunestudio.jobs.supervisor import Outcome, Supervisor
from tunestudio.jobs.tracker import Tracker
from tunestudio.jobs.views import MetricViews
from tunestudio.paths import expand
from tunestudio.process import gpu_count, usable_cores
from tunestudio.settings import Settings
from tunestudio.worker import child
from tunestudio.worker.child import WorkerEntry

log = logging.getLogger(__name__)
S = JobStatus


def _check_takeable(output_dir: str) -> None:
    """PathRefused unless the job can take this folder as its own (tunestudio.ownership), before it is queued."""
    try:
        ownership.check(expand(output_dir))
    except ownership.NotOurs as exc:
        raise paths.PathRefused("output_dir", str(exc), code="output_dir_not_empty") from None


def _same_request(row: dict, request_id: str, kind: str, source_job: str | None) -> Job:
    """The job an idempotency key made before, if it was the same kind of request (of the same source)."""
    job = Job.from_row(row)
    if job.kind != kind or job.source_job != source_job:
        raise JobConflict(f"request id {request_id!r} was used for another request (job {job.id}, a {job.kind} "
                          "job); use a new key for a new request")
    return job


def new_job_id() -> str:
    return datetime.now().strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


class JobManager:
    def __init__(
        self,
        settings: Settings | None = None,
        *,
        worker_target: WorkerEntry = child.main,
        adopt_queued: bool = True,
    ) -> None:
        self.settings = settings or Settings()
        self.data_dir = self.settings.data_dir()
        self._store = Store(self.data_dir / "tunestudio.db")
        self._slots = Slots(self.data_dir / "slots")
        self._owners = Owners(self._store, self.settings.request_poll_seconds)
        self._streams = Streams(self._store, self.settings.request_poll_seconds, lambda: self._closing)
        self.views = MetricViews(self._store)
        self.worker_target = worker_target
        self.adopt_queued = adopt_queued
        self._lock = threading.RLock()
        self._submit_lock = threading.Lock()
        self._tracker = Tracker(self._store)
        self._jobs = self._tracker.jobs  # the jobs this process queued or runs
        self._queue: deque[str] = deque()
        self._running: set[str] = set()
        self._wake = threading.Condition(self._lock)
        self._closing = False
        self._scheduler: threading.Thread | None = None

    # --- lifecycle -------------------------------------------------------------
    def start(self) -> JobManager:
        """Recover what a dead process left behind, then start the scheduler."""
        with self._lock:
            if self._scheduler is not None:
                return self
            self._recover()
            if self.settings.prewarm:
                prewarm.warm_up()
            self._scheduler = threading.Thread(target=self._schedule_loop, name="scheduler", daemon=True)
            self._scheduler.start()
        return self

    def close(self, save: bool = True, timeout: float = 60.0) -> None:
        """Stop what is running (saving a checkpoint unless save=False), wait for it, close the store.

        Queued jobs stay queued in the store; the next manager on this data directory runs them.
        """
        with self._lock:
            self._closing = True
            self._queue.clear()
            running = [(j, self._jobs[j].supervisor) for j in self._running if self._jobs[j].supervisor]
            self._wake.notify_all()
        for job_id, _ in running:
            with contextlib.suppress(JobConflict, JobNotFound):
                self.stop(job_id, save=save)
        deadline = time.monotonic() + timeout
        for _, sup in running:
            if sup is not None and sup.wait(max(0.0, deadline - time.monotonic())) is None:
                sup.cancel()  # out of patience: escalate to SIGTERM/SIGKILL
                sup.wait(self.settings.stop_grace_seconds + self.settings.kill_after_seconds + 5)
        if self._scheduler is not None:
            self._scheduler.join(timeout=5)
        self._store.close()

    def __enter__(self) -> JobManager:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def flush(self) -> None:
        """Wait until every write so far is committed (what another process reads is then current)."""
        self._store.flush()

    def _recover(self) -> None:
        for row in self._owners.orphans():
            if JobStatus(row["status"]) is S.queued:
                if self.adopt_queued:
                    self._store.update_job(row["id"], owner_pid=os.getpid())
                    self._tracker.track(row["id"], row["last_seq"])
                    self._queue.append(row["id"])
                continue
            self._seal(row["id"], row["output_dir"])
            message = f"interrupted: the process running this job ended while it was {row['status']}"
            self._tracker.track(row["id"], row["last_seq"], status=JobStatus(row["status"]))
            self._tracker.set_status(row["id"], S.interrupted, message=message, finished_at=time.time(),
                             checkpoint=latest_checkpoint(row["output_dir"]))
            self._jobs.pop(row["id"], None)
        self._store.flush()

    # --- the public face -------------------------------------------------------
    def submit(self, config: JobConfig, request_id: str | None = None, resumed_from: str | None = None,
               warnings: Sequence[str] = ()) -> Job:
        """Check the config's paths, record a new job and queue it; the same request_id gives the same job.

        Raises paths.PathRefused for a path that is missing or would write over the data directory or
        another job's outputs, QueueFull when `max_queued_jobs` jobs wait already. warnings: what the caller
        has to say about the request (e.g. fields it ignored), as the job's first warning events.
        """
        config = paths.resolve(config)
        self._check_processes(config.num_processes)
        paths.protect_inputs(config)
        if config.output_dir:
            _check_takeable(config.output_dir)
        with self._submit_lock:  # the checks against other jobs and the insert, one submit at a time
            if request_id and (existing := self._store.find_by_request_id(request_id)) is not None:
                return _same_request(existing, request_id, "train", None)
            others = [(row["output_dir"], JobStatus(row["status"]).is_live) for row in self._store.output_dirs()]
            paths.protect_data_dir(config, self.data_dir, others)
            if self._store.count_jobs([S.queued.value]) >= self.settings.max_queued_jobs:
                raise QueueFull(f"{self.settings.max_queued_jobs} jobs are queued already "
                                "(TUNESTUDIO_MAX_QUEUED_JOBS); wait for some to start or cancel them")
            job_id = new_job_id()
            job_dir = self.settings.jobs_dir() / job_id
            if not config.output_dir:
                config = config.model_copy(update={"output_dir": str(job_dir / "output")})
            try:
                self._store.insert_job({
                    "id": job_id, "request_id": request_id, "status": S.queued.value, "message": "queued",
                    "config": config.public_dict(), "created_at": time.time(), "output_dir": config.output_dir,
                    "resumed_from": resumed_from, "owner_pid": os.getpid(), "log_path": str(job_dir / "worker.log"),
                })
            except DuplicateRequest as dup:  # another process took this request id first
                return self.get(dup.job_id)
        self._enqueue(job_id, config, warnings)
        return self.get(job_id)

    def _check_processes(self, num_processes: int) -> None:
        """Refuse more ranks than this machine has cores (or GPUs): each rank is a process with its own copy of
        the model. A Ray cluster places ranks itself and is not checked here."""
        if num_processes <= 1 or self.settings.executor != "local":
            return
        cores, gpus = usable_cores(), gpu_count()
        if num_processes > max(cores, gpus):
            # a config field refused by what the machine has: the same 422 naming the field as a path's refusal
            raise paths.PathRefused("num_processes", f"{num_processes} ranks on a machine with {cores} CPU cores and "
                                    f"{gpus or 'no'} GPU{'s' if gpus != 1 else ''}: at most {max(cores, gpus)} here",
                                    code="too_many_processes")

    def _enqueue(self, job_id: str, config: JobConfig | ExportConfig, warnings: Sequence[str] = ()) -> None:
        with self._lock:
            running = self._tracker.track(job_id, config=config, secrets=config.secrets())
            with running.feed.lock:
                running.feed.emit([StatusEvent(seq=0, status=S.queued.value, message="queued"),
                                   *(WarningEvent(seq=0, message=text) for text in warnings)])
            self._queue.append(job_id)
            self._wake.notify_all()

    def export(self, job_id: str, options: ExportOptions, request_id: str | None = None) -> Job:
        """Queue an export of a finished job's result: a job of kind "export", linked to it by source_job.

        It shares the queue, slots, store, stream and cancel with training jobs. Raises JobNotFound,
        JobConflict for a job with nothing to export (not finished, an export itself), PathRefused for an
        output folder that would write over the data directory or another job's outputs, QueueFull.
        """
        source = self.get(job_id)
        if source.kind != "train":
            raise JobConflict(f"job {job_id} is an export; export the training job {source.source_job} instead")
        if source.status not in (S.completed, S.stopped) or not source.output_dir:
            raise JobConflict(f"job {job_id} is {source.status.value}; only a completed job (or one stopped with "
                              "a save) has a result to export")
        if not Path(source.output_dir).is_dir():
            raise JobConflict(f"job {job_id}'s output folder {source.output_dir} is gone; nothing to export")
        checkpoint = paths.export_checkpoint(options.checkpoint, source.output_dir)
        fields = {**options.model_dump(exclude={"hf_token"}), "hf_token": options.hf_token}
        fields["checkpoint"] = checkpoint
        config = ExportConfig(**fields, source_job_id=job_id, source_dir=source.output_dir)
        output_dir = str(expand(config.resolved_output_dir()).resolve())
        config = config.model_copy(update={"output_dir": output_dir})
        with self._submit_lock:
            if request_id and (existing := self._store.find_by_request_id(request_id)) is not None:
                return _same_request(existing, request_id, "export", job_id)
            others = [(row["output_dir"], JobStatus(row["status"]).is_live) for row in self._store.output_dirs()]
            paths.protect_export_dir(output_dir, source.output_dir, self.data_dir, others)
            paths.protect_export_inputs(output_dir, source.config, checkpoint)
            _check_takeable(output_dir)
            if self._store.count_jobs([S.queued.value]) >= self.settings.max_queued_jobs:
                raise QueueFull(f"{self.settings.max_queued_jobs} jobs are queued already "
                                "(TUNESTUDIO_MAX_QUEUED_JOBS); wait for some to start or cancel them")
            export_id = new_job_id()
            try:
                self._store.insert_job({
                    "id": export_id, "request_id": request_id, "status": S.queued.value, "message": "queued",
                    "config": config.public_dict(), "created_at": time.time(), "output_dir": output_dir,
                    "owner_pid": os.getpid(), "kind": "export", "source_job": job_id,
                    "log_path": str(self.settings.jobs_dir() / export_id / "worker.log"),
                })
            except DuplicateRequest as dup:
                return self.get(dup.job_id)
        self._enqueue(export_id, config)
        return self.get(export_id)

    def stop(self, job_id: str, save: bool = True) -> Job:
        """Stop a job at its next step; save=True keeps a resumable checkpoint, False is a cancel."""
        job = self.get(job_id)
        if job_id not in self._jobs and job.status.is_live:
            return self._owners.ask(job_id, save, self.get)  # not ours: no lock held while the owner answers
        with self._lock:
            running = self._jobs.get(job_id)
            if job.status is S.queued and job_id in self._queue:
                self._queue.remove(job_id)
                self._tracker.finish_without_worker(job_id, S.cancelled, "cancelled before it started")
                return self.get(job_id)
            if running is None or running.status.is_terminal:
                raise JobConflict(f"job {job_id} is {job.status.value}; only a live job can be stopped")
            wanted = S.stopping if save else S.cancelling
            if running.status is wanted or (running.status is S.cancelling and save):
                return job  # asked already (a cancel is not downgraded to a stop)
            if not can_transition(running.status, wanted):
                verb = "stopped" if save else "cancelled"
                raise JobConflict(f"job {job_id} is {running.status.value}; it cannot be {verb}")
            supervisor = running.supervisor
            self._tracker.set_status(job_id, wanted, message="stopping: saving a checkpoint" if save else "cancelling")
        if supervisor is not None:
            supervisor.stop(save=save)
        self._store.flush()  # committed before the answer: the caller reads the new status back at once
        return self.get(job_id)

    def cancel(self, job_id: str) -> Job:
        return self.stop(job_id, save=False)

    def resume(self, job_id: str, secrets: dict[str, str] | None = None, num_processes: int | None = None) -> Job:
        """A new job that continues from this one's checkpoint, linked by resumed_from.

        num_processes: run the rest on this many ranks (the checkpoint's step is kept either way).

        At most one resume of a job wins: a second, or one racing a delete, is a JobConflict.
        """
        with self._lock:  # resume and delete of one job, from any threads, one at a time
            job = self.get(job_id)
            if job.kind != "train":
                raise JobConflict(f"job {job_id} is an export; exports do not resume: export again")
            if job.status not in RESUMABLE:
                raise JobConflict(f"job {job_id} is {job.status.value}; only stopped, interrupted or failed jobs "
                                  "resume")
            if (child_id := self._store.resumed_by(job_id)) is not None:
                raise JobConflict(f"job {job_id} was resumed already, as job {child_id}; resume that one")
            checkpoint = job.checkpoint or latest_checkpoint(job.output_dir)
            if checkpoint is None or not Path(checkpoint).is_dir():
                raise JobConflict(f"job {job_id} has no checkpoint to resume from")
            running = self._jobs.get(job_id)
            kept = dict(running.secrets) if running else {}
            public = {**job.config, "resume_from_checkpoint": checkpoint, "output_dir": None}
            if num_processes is not None:
                public["num_processes"] = num_processes
            config = JobConfig.from_parts(public, {**kept, **(secrets or {})})
            return self.submit(config, resumed_from=job_id)

    def delete(self, job_id: str, delete_artifacts: bool = False, delete_exports: bool = False) -> None:
        """Forget a finished job; delete_artifacts also removes what it wrote (tunestudio.ownership: only what
        its own marker lists, and its folder only if the job created it and nothing else is left) and its job
        folder (the log).

        A job's exports are jobs of their own: deleted alone, they take only their own folder. Deleting a
        job's artefacts while exports of it have files is a JobConflict naming them (`exports`), unless
        delete_exports: then they go first, artefacts and all. Raises JobConflict, before anything is
        deleted, for a live job, or for artefacts another job (one resumed from it, one writing to the same
        folder or inside what would be removed) still refers to.
        """
        with self._lock:
            job = self.get(job_id)
            if job.status.is_live:
                raise JobConflict(f"job {job_id} is {job.status.value}; stop or cancel it before deleting it")
            if (child_id := self._store.resumed_by(job_id)) is not None:
                raise JobConflict(f"job {child_id} was resumed from job {job_id} and refers to it; delete it first")
            exports = [row for row in self._store.exports_of(job_id)
                       if JobStatus(row["status"]).is_live or ownership.files(Path(row["output_dir"] or ""), row["id"])]
            if delete_artifacts and exports:
                live = [row["id"] for row in exports if JobStatus(row["status"]).is_live]
                if live:
                    raise JobConflict(f"export {live[0]} of job {job_id} is running; cancel it first")
                if not delete_exports:
                    ids = [row["id"] for row in exports]
                    raise JobConflict(f"job {job_id} has {len(ids)} export(s) with files ({', '.join(ids)}); "
                                      "delete them with it (delete_exports) or first", exports=ids)
                for row in exports:
                    self.delete(row["id"], delete_artifacts=True)
            output = Path(job.output_dir).resolve() if delete_artifacts and job.output_dir else None
            if output is not None:
                removed = [str(p) for p in ownership.files(output, job_id)]
                for other in self._store.jobs_referring_to(str(output), removed, besides=job_id):
                    raise JobConflict(f"job {other} still refers to {output}; delete it first, or delete this job "
                                      "without its artefacts")
            self._store.delete_job(job_id)
            self._jobs.pop(job_id, None)
        if delete_artifacts:
            if output is not None:
                ownership.release(output, job_id)
            shutil.rmtree(self.settings.jobs_dir() / job_id, ignore_errors=True)  # the manager's own: the log
        self.views.drop(job_id)

    def rename(self, job_id: str, name: str | None, notes: str | None) -> Job:
        """Set a job's name and notes (any status; None clears one). Raises JobNotFound."""
        self.get(job_id)
        self._store.update_job(job_id, wait=True, name=name, notes=notes)
        return self.get(job_id)

    def get(self, job_id: str) -> Job:
        row = self._store.get_job(job_id)
        if row is None:
            raise JobNotFound(job_id)
        return Job.from_row(row)

    def list(self, status: list[JobStatus] | None = None, limit: int = 50, offset: int = 0) -> list[Job]:
        return [Job.from_row(r) for r in self._store.list_jobs([s.value for s in status or []], limit, offset)]

    def count(self, status: list[JobStatus] | None = None) -> int:
        return self._store.count_jobs([s.value for s in status or []])

    def metrics(self, job_id: str, max_points: int | None = None, since_step: int | None = None) -> list[dict]:
        """Metric records in step order, newer than since_step, downsampled to max_points (see views.py)."""
        with self._lock:
            running = self._jobs.get(job_id)
            seq = running.feed.seq if running is not None else None
        if seq is None:
            seq = self.get(job_id).last_seq
        return self.views.records(job_id, seq, max_points, since_step)

    def subscribe(
        self, job_id: str, after_seq: int = 0, deliver: Callable[[JobEvent], None] | None = None
    ) -> Subscription:
        """Events after `after_seq`: the stored ones (`replay`, an iterator, or `get()`), then live ones, once each."""
        self.get(job_id)
        with self._lock:
            running = self._jobs.get(job_id)
            feed = running.feed if running is not None else None
            live = running is not None and not running.status.is_terminal
            return self._streams.subscribe(job_id, after_seq, deliver, feed, live)

    # --- scheduling --------------------------------------------------------------
    def _schedule_loop(self) -> None:
        # This thread must outlive every worker it started (PR_SET_PDEATHSIG): nothing may end it but close().
        while True:
            with self._lock:
                if self._closing:
                    return
                try:
                    self._start_what_fits()
                except Exception:  # a full disk, a locked database...: try again next round
                    log.exception("scheduling failed")
                self._wake.wait(self.settings.request_poll_seconds)
                if self._closing:
                    return
            try:
                for job_id, save in self._owners.requests():
                    if job_id in self._jobs:
                        try:
                            self.stop(job_id, save=save)
                        except (JobConflict, JobNotFound) as exc:
                            log.info("stop request for job %s not applied: %s", job_id, exc)
            except Exception:
                log.exception("reading stop requests failed")

    def _start_what_fits(self) -> None:
        """Start queued jobs while this process and the data directory's slots have room (under self._lock)."""
        while self._queue and len(self._running) < self.settings.max_concurrent_jobs:
            head = self._queue[0]
            if self._owners.older_job_waits_elsewhere(head):
                self._note_waiting(head)  # first come, first served across processes too
                return
            slot = self._slots.acquire(self.settings.max_concurrent_jobs)
            if slot is None:  # another process on this data directory holds every slot: retry next round
                self._note_waiting(head)
                return
            job_id = self._queue.popleft()
            started = False
            try:
                started = self._start(job_id, slot)
            except Exception as exc:  # e.g. a stored config this version refuses: fail that job only
                log.exception("starting job %s failed", job_id)
                self._running.discard(job_id)
                with contextlib.suppress(Exception):
                    self._tracker.finish_without_worker(job_id, S.failed, f"could not start the job: {exc}")
            finally:
                if not started:
                    self._slots.release(slot)

    def _note_waiting(self, job_id: str) -> None:
        """Say once in a queued job's stream why it has not started although this process has a free slot."""
        running = self._jobs.get(job_id)
        if running is None or running.waiting_noted:
            return
        running.waiting_noted = True
        message = "waiting: another process on this data directory runs as many jobs as max_concurrent_jobs allows"
        with running.feed.lock:
            running.feed.emit([Log(seq=0, level="info", message=message)], message=message)

    def _start(self, job_id: str, slot: int) -> bool:
        """Start a queued job's worker in the given slot; False if it was not started (the slot is free again)."""
        row = self._store.get_job(job_id)
        running = self._jobs[job_id]
        if row is None or JobStatus(row["status"]) is not S.queued:
            return False
        # A job another process queued (adopted at start-up) is validated from its stored config here.
        config = running.config or self._stored_config(row, running.secrets)
        Path(row["log_path"]).parent.mkdir(parents=True, exist_ok=True)
        supervisor = Supervisor(
            config,
            lambda events: self._tracker.on_events(job_id, events),
            on_exit=lambda outcome: self._on_exit(job_id, outcome),
            target=self.worker_target,
            log_path=Path(row["log_path"]),
            stop_grace_seconds=self.settings.stop_grace_seconds,
            save_grace_seconds=self.settings.save_grace_seconds,
            kill_after_seconds=self.settings.kill_after_seconds,
            exit_after_terminal_seconds=self.settings.exit_after_terminal_seconds,
            executor=executor_for(
                config,
                self.worker_target,
                prewarm=self.settings.prewarm,
                kind=self.settings.executor,
                ray_address=self.settings.ray_address,
                private_network=self.settings.private_network,
                cache_dir=str(self.settings.cache_dir()),
            ),
        )
        if row["output_dir"]:
            try:  # the job's output folder becomes its own before anything is written there
                ownership.take(Path(row["output_dir"]), job_id)
            except (ownership.NotOurs, OSError) as exc:
                self._tracker.finish_without_worker(job_id, S.failed, f"output_dir: {exc}")
                return False
        running.supervisor = supervisor
        self._running.add(job_id)
        self._tracker.set_status(job_id, S.starting, message="starting the worker", started_at=time.time())
        try:
            supervisor.start()
        except Exception as exc:
            self._running.discard(job_id)
            self._tracker.finish_without_worker(job_id, S.failed, f"could not start the worker: {exc}")
            return False
        running.slot = slot
        self._store.update_job(job_id, worker_pid=supervisor.pid)
        return True

    def _seal(self, job_id: str, output_dir: str | None = None) -> None:
        """Record what the job's worker wrote in its output folder: what delete may remove later. A job that
        wrote nothing gives the folder back at once (one it created and left empty goes)."""
        if output_dir is None:
            row = self._store.get_job(job_id)
            output_dir = row["output_dir"] if row else None
        if output_dir:
            try:
                if not ownership.seal(Path(output_dir), job_id):
                    ownership.release(Path(output_dir), job_id)
            except OSError as exc:  # a full disk, a folder gone: delete then removes less, never more
                log.warning("job %s: recording its files in %s failed: %s", job_id, output_dir, exc)

    @staticmethod
    def _stored_config(row: dict, secrets: dict[str, str]) -> JobConfig | ExportConfig:
        if row.get("kind") == "export":
            return ExportConfig.from_parts(row["config"], secrets)
        return paths.resolve(JobConfig.from_parts(row["config"], secrets))

    def _on_exit(self, job_id: str, outcome: Outcome) -> None:
        try:
            self._seal(job_id)
            self._tracker.record_exit(job_id, outcome)
        finally:
            with self._lock:
                running = self._jobs[job_id]
                self._running.discard(job_id)
                running.supervisor = None
                if running.slot is not None:
                    self._slots.release(running.slot)
                    running.slot = None
                self._wake.notify_all()


__all__ = ["Job", "JobConflict", "JobEvent", "JobManager", "JobNotFound", "QueueFull", "Subscription"]
