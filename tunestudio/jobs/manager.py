"""The public face of jobs: submit, export, stop, cancel, resume, delete, get, list, metrics, subscribe,
eval_rows.

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
job's `feed.lock` (its status and stream), never after. A worker starts with no lock held
(`_prepare` under `_lock`, then `_launch`; the scheduler's half is jobs/scheduling.py); a stop asked
meanwhile is passed on once it runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from tunestudio import paths
from tunestudio.bench_config import BenchConfig
from tunestudio.bench_tasks import check_tasks
from tunestudio.config import JobConfig
from tunestudio.events import StatusEvent, WarningEvent
from tunestudio.export_config import ExportConfig, ExportOptions
from tunestudio.jobs import admission, artefacts, evalrows, prewarm
from tunestudio.jobs.models import Job, JobConflict, JobEvent, JobNotFound, QueueFull
from tunestudio.jobs.owners import Owners
from tunestudio.jobs.scheduling import Scheduling
from tunestudio.jobs.slots import Slots
from tunestudio.jobs.status import JobStatus, can_transition
from tunestudio.jobs.store import DuplicateRequest, Store
from tunestudio.jobs.stream import Streams, Subscription
from tunestudio.jobs.tracker import Tracker
from tunestudio.jobs.views import MetricViews
from tunestudio.make_data_config import MakeDataConfig
from tunestudio.make_data_config import resolve as resolve_recipe
from tunestudio.settings import Settings
from tunestudio.worker import child
from tunestudio.worker.child import WorkerEntry

log = logging.getLogger(__name__)
S = JobStatus
MESSAGE_KINDS = ("log", "warning", "failed", "completed")  # the events that say something (see messages())


class JobManager(Scheduling):
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
            artefacts.seal(row["id"], row["output_dir"])
            self._tracker.interrupt(row)
        self._store.flush()

    # --- the public face -------------------------------------------------------
    def submit(self, config: JobConfig, request_id: str | None = None, resumed_from: str | None = None,
               warnings: Sequence[str] = (), sweep: tuple[str, int] | None = None) -> Job:
        """Check the config (jobs/admission.py), record a new job and queue it; the same request_id gives the
        same job.

        Raises paths.PathRefused for a path that is missing, would write over the data directory, another
        job's outputs, the job's inputs or the user's files (or too many ranks), QueueFull when
        `max_queued_jobs` jobs wait already. warnings: what the caller has to say about the request (e.g.
        fields it ignored), as the job's first warning events. sweep: (sweep id, trial number) of a sweep's
        trial, its tag (`list(sweep_id=...)` finds it).
        """
        config = admission.check_train(config, self.settings)
        return self._record("train", config, request_id,
                            lambda others: paths.protect_data_dir(config, self.data_dir, others),
                            resumed_from=resumed_from, warnings=warnings, sweep=sweep)

    def export(self, job_id: str, options: ExportOptions, request_id: str | None = None) -> Job:
        """Queue an export of a finished job's result: a job of kind "export", linked to it by source_job.

        It shares the queue, slots, store, stream and cancel with training jobs. Raises JobNotFound,
        JobConflict for a job with nothing to export (not finished, an export itself), PathRefused for an
        output folder that would write over the data directory, another job's outputs, the export's inputs
        or the user's files, QueueFull.
        """
        source = self.get(job_id)
        config = admission.export_config(source, options)
        return self._record("export", config, request_id,
                            lambda others: admission.check_export(config, source, self.data_dir, others),
                            source_job=job_id)

    def benchmark(self, config: BenchConfig, request_id: str | None = None) -> Job:
        """Queue a benchmark of a finished job (config.source_job_id) through lm-evaluation-harness: a job of kind
        "bench", linked to it by source_job, sharing the queue, slots, store, stream and cancel. Raises JobNotFound,
        JobConflict for a job with no result to measure, UnknownTasks for a task the harness's cached index lacks
        (a repeated request id gets its job first), QueueFull."""
        source = self.get(config.source_job_id)
        if not source.has_result:
            raise JobConflict(f"job {source.id} is a {source.kind} job that is {source.status.value}; only a "
                              "training job that completed (or stopped with a save) can be benchmarked")
        cache_dir = self.settings.cache_dir()
        return self._record("bench", config.model_copy(update={"output_dir": None}), request_id,
                            lambda others: check_tasks(config.tasks, cache_dir, config.eval_file),
                            source_job=source.id)

    def make_data(self, config: MakeDataConfig, request_id: str | None = None) -> Job:
        """Queue a data-making recipe (kind "make_data", about no job): its paths resolved and its output file checked
        (new, or one the studio wrote: then appended to). Raises PathRefused, JobConflict while another live job
        writes the same file, QueueFull."""
        config = resolve_recipe(config)

        def protect(others: list[tuple[str, bool]]) -> None:
            paths.protect_data_dir(config, self.data_dir, others)  # type: ignore[arg-type]  # its output_dir only
            live = self.list([s for s in S if s.is_live], limit=10_000)
            if any(isinstance(j.config, MakeDataConfig) and j.config.output == config.output for j in live):
                raise JobConflict(f"another job is writing {config.output}; wait for it, or stop it")

        return self._record("make_data", config, request_id, protect)

    def _record(self, kind: str, config: JobConfig | ExportConfig | BenchConfig | MakeDataConfig,
                request_id: str | None,
                protect: Callable[[list[tuple[str, bool]]], None], source_job: str | None = None,
                resumed_from: str | None = None, warnings: Sequence[str] = (),
                sweep: tuple[str, int] | None = None) -> Job:
        """Insert a checked job (queued) and queue it; `protect` checks its output against the other jobs'."""
        with self._submit_lock:  # the checks against other jobs and the insert, one submit at a time
            if request_id and (existing := self._store.find_by_request_id(request_id)) is not None:
                return admission.same_request(existing, request_id, kind, source_job)
            protect(artefacts.claimed_outputs(self._store))
            if self._store.count_jobs([S.queued.value]) >= self.settings.max_queued_jobs:
                raise QueueFull(f"{self.settings.max_queued_jobs} jobs are queued already "
                                "(TUNESTUDIO_MAX_QUEUED_JOBS); wait for some to start or cancel them")
            job_id = admission.new_job_id()
            job_dir = self.settings.jobs_dir() / job_id
            if not config.output_dir:
                config = config.model_copy(update={"output_dir": str(job_dir / "output")})
            try:
                self._store.insert_job({
                    "id": job_id, "request_id": request_id, "status": S.queued.value, "message": "queued",
                    "config": config.public_dict(), "created_at": time.time(), "output_dir": config.output_dir,
                    "resumed_from": resumed_from, "owner_pid": os.getpid(), "kind": kind, "source_job": source_job,
                    "log_path": str(job_dir / "worker.log"),
                    "sweep_id": sweep[0] if sweep else None, "trial": sweep[1] if sweep else None,
                })
            except DuplicateRequest as dup:  # another process took this request id first
                return self.get(dup.job_id)
        with self._lock:
            running = self._tracker.track(job_id, config=config, secrets=config.secrets())
            with running.feed.lock:
                running.feed.emit([StatusEvent(seq=0, status=S.queued.value, message="queued"),
                                   *(WarningEvent(seq=0, message=text) for text in warnings)])
            self._queue.append(job_id)
            self._wake.notify_all()
        return self.get(job_id)

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
            supervisor = running.supervisor if running.launched else None  # else _launch tells it once it runs
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
            running = self._jobs.get(job_id)
            kept = dict(running.secrets) if running else {}
            config = admission.resume_config(job, self._store.resumed_by(job_id), {**kept, **(secrets or {})},
                                             num_processes)
            resumed = self.submit(config, resumed_from=job_id)
            if job.name or job.notes:  # the same work, carried on: it keeps what the user called it
                return self.rename(resumed.id, job.name, job.notes)
            return resumed

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
            if delete_artifacts:
                for row in artefacts.exports_in_the_way(self._store, job_id, take_them=delete_exports):
                    self.delete(row["id"], delete_artifacts=True)
                artefacts.check_users(self._store, job)
            self._store.delete_job(job_id)
            # A job's end is recorded before its exit handler frees its slot (scheduling._on_exit): a delete in
            # between leaves the record to _free, which forgets it once the slot is released.
            if job_id in self._running and job_id in self._jobs:
                self._jobs[job_id].deleted = True
            else:
                self._jobs.pop(job_id, None)
        if delete_artifacts:
            artefacts.remove(job, self.settings.jobs_dir())
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

    def list(self, status: list[JobStatus] | list[str] | None = None, limit: int = 50, offset: int = 0,
             sweep_id: str | None = None) -> list[Job]:
        """Jobs, newest first; sweep_id: only that sweep's trials."""
        rows = self._store.list_jobs([str(s) for s in status or []], limit, offset, sweep_id=sweep_id)
        return [Job.from_row(r) for r in rows]

    def count(self, status: list[JobStatus] | list[str] | None = None) -> int:  # a JobStatus, or its value
        return self._store.count_jobs([str(s) for s in status or []])

    def metrics(self, job_id: str, max_points: int | None = None, since_step: int | None = None) -> list[dict]:
        """Metric records in step order, newer than since_step, downsampled to max_points (see views.py)."""
        with self._lock:
            running = self._jobs.get(job_id)
            seq = running.feed.seq if running is not None else None
        if seq is None:
            seq = self.get(job_id).last_seq
        return self.views.records(job_id, seq, max_points, since_step)

    def on_commit(self, listener: Callable[[frozenset[str]], None]) -> Callable[[], None]:
        """`listener(job_ids)` each time this process commits a write that inserted, deleted, gave a new status or
        an evaluation to those jobs, on the store's writer thread: it must return at once. Jobs another process runs
        are not heard of. Returns the call that stops it."""
        self._store.add_listener(listener)
        return lambda: self._store.remove_listener(listener)

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

    def messages(self, job_id: str, upto: int | None = None, limit: int = 500) -> list[JobEvent]:
        """The job's log, warning, failed and completed events up to seq `upto` (the newest `limit`), oldest first:
        what a finished job said, without replaying its progress. Raises JobNotFound."""
        self.get(job_id)
        rows = self._store.messages(job_id, MESSAGE_KINDS, upto, limit)
        return [JobEvent(seq, kind, text) for seq, kind, text in rows]

    def resources(self, job_id: str, upto: int | None = None, limit: int = 10_000) -> list[JobEvent]:
        """The job's resource samples (`Resources` events: CPU, memory, GPU of its processes) up to seq `upto`, the
        newest `limit`, oldest first. Raises JobNotFound."""
        self.get(job_id)
        rows = self._store.messages(job_id, ("resources",), upto, limit)
        return [JobEvent(seq, kind, text) for seq, kind, text in rows]

    def eval_rows(self, job_id: str, by: str = "loss", order: evalrows.Order = "worst", limit: int = 50,
                  offset: int = 0) -> evalrows.RowsPage:
        """A finished job's held-out rows, one by one, ordered by loss or a generation metric (worst or best first;
        see evalrows.py). Raises JobNotFound, or JobConflict saying why the job has none."""
        return evalrows.page(self.get(job_id), by, order, limit, offset)


__all__ = ["Job", "JobConflict", "JobEvent", "JobManager", "JobNotFound", "QueueFull", "Subscription"]
