"""The public face of jobs: submit, stop, cancel, resume, get, list, metrics, subscribe.

Routes and the CLI call this and nothing deeper. The manager owns the queue
(FIFO, `max_concurrent_jobs` slots), one supervisor per running job, the
fan-out of events to subscribers, and the recovery of jobs a dead process left
behind. Every status change goes through `status.transition`. Slots are
shared with every other process on the same data directory (`slots.py`): a
server and a `tunestudio train` beside it run at most `max_concurrent_jobs`
jobs together.

Threads: callers (any thread), one scheduler thread that starts workers (it
lives as long as the manager, because a worker's PR_SET_PDEATHSIG fires when
the *thread* that started it ends), and each supervisor's pump thread, which
calls `_on_events` (one burst of the worker's events at a time) and `_on_exit`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from tunestudio.config import JobConfig
from tunestudio.events import Completed, Event, Failed, Phase, Progress
from tunestudio.jobs import prewarm
from tunestudio.jobs.downsample import ChartView
from tunestudio.jobs.models import Job, JobConflict, JobEvent, JobNotFound
from tunestudio.jobs.slots import Slots
from tunestudio.jobs.status import RESUMABLE, RUNNING, IllegalTransition, JobStatus, can_transition, transition
from tunestudio.jobs.store import INT64_MAX, DuplicateRequest, Store
from tunestudio.jobs.supervisor import Outcome, Supervisor
from tunestudio.settings import Settings
from tunestudio.worker import child

log = logging.getLogger(__name__)
S = JobStatus
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
VIEW_RECORDS = 50_000  # metric records the cached chart views may hold together (~50 MB) ...
MAX_VIEWS = 256  # ... and how many views there may be


def new_job_id() -> str:
    return datetime.now().strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def latest_checkpoint(output_dir: str | None) -> str | None:
    """The highest checkpoint-N folder in output_dir that holds a trainer state."""
    if not output_dir or not Path(output_dir).is_dir():
        return None
    found = []
    for path in Path(output_dir).iterdir():
        match = _CHECKPOINT.match(path.name)
        if match and (path / "trainer_state.json").is_file():
            found.append((int(match.group(1)), path))
    return str(max(found)[1]) if found else None


class Subscription:
    """Events of one job after a given seq: first the stored ones, then live ones as they happen.

    `deliver` (if given) is called for each live event from the pump thread and
    must not block; otherwise events are buffered for `get()`.
    """

    def __init__(self, manager: JobManager, job_id: str, deliver: Callable[[JobEvent], None] | None) -> None:
        self._manager = manager
        self.job_id = job_id
        self.replay: Iterator[JobEvent] = iter(())  # the stored events, read from the store a page at a time
        self._replaying = True
        self._buffer: deque[JobEvent] = deque()
        self._ready = threading.Condition()
        self._deliver = deliver
        self.closed = False
        self._closed_event = threading.Event()  # wakes a store tail (see JobManager._tail) on close

    def _push(self, event: JobEvent) -> None:
        if self._deliver is not None:
            self._deliver(event)
            return
        with self._ready:
            self._buffer.append(event)
            self._ready.notify_all()

    def get(self, timeout: float | None = None) -> JobEvent | None:
        """The next event (replayed ones first), or None after `timeout` seconds."""
        if self._replaying:
            event = next(self.replay, None)
            if event is not None:
                return event
            self._replaying = False
        with self._ready:
            if not self._buffer:
                self._ready.wait(timeout)
            return self._buffer.popleft() if self._buffer else None

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._closed_event.set()
            self._manager._unsubscribe(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class _Running:
    """What the manager keeps in memory about a live job."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    status: JobStatus = S.queued
    seq: int = 0
    supervisor: Supervisor | None = None
    subscribers: list[Subscription] = field(default_factory=list)
    secrets: dict[str, str] = field(default_factory=dict)
    completed: Completed | None = None
    failed: bool = False  # the worker sent a Failed event
    slot: int | None = None  # the job slot (see slots.py) its worker holds
    waiting_noted: bool = False  # told its stream it waits for another process's slot


@dataclass
class _View:
    """A metrics answer as of event `seq`, and the chart it came from (None: not downsampled)."""

    seq: int
    chart: ChartView | None
    records: list[dict[str, Any]]
    by_rowid: dict[int, dict[str, Any]]  # the chart's records by metrics rowid


class JobManager:
    def __init__(
        self,
        settings: Settings | None = None,
        *,
        worker_target: Callable[..., None] = child.main,
        adopt_queued: bool = True,
    ) -> None:
        self.settings = settings or Settings()
        self.data_dir = self.settings.data_dir()
        self.store = Store(self.data_dir / "tunestudio.db")
        self._slots = Slots(self.data_dir / "slots")
        self.worker_target = worker_target
        self.adopt_queued = adopt_queued
        self._lock = threading.RLock()
        self._jobs: dict[str, _Running] = {}
        self._queue: deque[str] = deque()
        self._running: set[str] = set()
        self._wake = threading.Condition(self._lock)
        self._closing = False
        self._views: dict[tuple[str, int | None, int | None], _View] = {}  # least recently used first
        self._views_lock = threading.Lock()
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
            if sup.wait(max(0.0, deadline - time.monotonic())) is None:
                sup.cancel()  # out of patience: escalate to SIGTERM/SIGKILL
                sup.wait(self.settings.stop_grace_seconds + self.settings.kill_after_seconds + 5)
        if self._scheduler is not None:
            self._scheduler.join(timeout=5)
        self.store.close()

    def __enter__(self) -> JobManager:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _recover(self) -> None:
        me = os.getpid()
        for row in self.store.list_jobs(limit=1_000_000, oldest_first=True):
            status = JobStatus(row["status"])
            if status.is_terminal:
                continue
            if row["owner_pid"] and row["owner_pid"] != me and child.pid_alive(row["owner_pid"]):
                continue  # another live process (a CLI run, a server) owns it
            if status is S.queued:
                if self.adopt_queued:
                    self.store.update_job(row["id"], owner_pid=me)
                    self._jobs[row["id"]] = _Running(status=S.queued, seq=row["last_seq"])
                    self._queue.append(row["id"])
                continue
            checkpoint = latest_checkpoint(row["output_dir"])
            message = f"interrupted: the process running this job ended while it was {status.value}"
            self._jobs[row["id"]] = _Running(status=status, seq=row["last_seq"])
            self._set_status(row["id"], S.interrupted, message=message, checkpoint=checkpoint, finished_at=time.time())
            self._jobs.pop(row["id"], None)
        self.store.flush()

    # --- the public face -------------------------------------------------------
    def submit(self, config: JobConfig, request_id: str | None = None, resumed_from: str | None = None) -> Job:
        """Record a new job and queue it; the same request_id always gives the same job."""
        if request_id:
            existing = self.store.find_by_request_id(request_id)
            if existing is not None:
                return Job.from_row(existing)
        job_id = new_job_id()
        job_dir = self.settings.jobs_dir() / job_id
        if not config.output_dir:
            # Validated again, not copied: fields that depend on output_dir follow it.
            config = JobConfig.from_parts({**config.public_dict(), "output_dir": str(job_dir / "output")},
                                          config.secrets())
        try:
            self.store.insert_job(
                {
                    "id": job_id,
                    "request_id": request_id,
                    "status": S.queued.value,
                    "message": "queued",
                    "config": config.public_dict(),
                    "created_at": time.time(),
                    "output_dir": config.output_dir,
                    "resumed_from": resumed_from,
                    "owner_pid": os.getpid(),
                    "log_path": str(job_dir / "worker.log"),
                }
            )
        except DuplicateRequest as dup:
            return self.get(dup.job_id)
        with self._lock:
            self._jobs[job_id] = _Running(secrets=config.secrets())
            self._emit(job_id, "status", {"status": S.queued.value, "message": "queued"})
            self._queue.append(job_id)
            self._wake.notify_all()
        return self.get(job_id)

    def stop(self, job_id: str, save: bool = True) -> Job:
        """Stop a job at its next step; save=True keeps a resumable checkpoint, False is a cancel."""
        job = self.get(job_id)
        if job_id not in self._jobs and job.status.is_live:
            return self._ask_owner(job_id, save)  # not ours: no lock held while the owner answers
        with self._lock:
            running = self._jobs.get(job_id)
            if job.status is S.queued and job_id in self._queue:
                self._queue.remove(job_id)
                self._finish_without_worker(job_id, S.cancelled, "cancelled before it started")
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
            self._set_status(job_id, wanted, message="stopping: saving a checkpoint" if save else "cancelling")
        if supervisor is not None:
            supervisor.stop(save=save)
        self.store.flush()  # committed before the answer: the caller reads the new status back at once
        return self.get(job_id)

    def cancel(self, job_id: str) -> Job:
        return self.stop(job_id, save=False)

    def _ask_owner(self, job_id: str, save: bool) -> Job:
        """A live job another process runs (a CLI run, a server): leave it a request in the store.

        The owner's scheduler picks it up within `request_poll_seconds` and stops the job as if asked directly.
        """
        row = self.store.get_job(job_id) or {}
        owner = row.get("owner_pid")
        if not owner or owner == os.getpid() or not child.pid_alive(owner):
            raise JobConflict(f"job {job_id} is {row.get('status')}, but the process that ran it (pid {owner}) is "
                              "gone; it becomes interrupted when tunestudio next starts on this data directory")
        wanted = "stop" if save else "cancel"
        if row.get("stop_request") != "cancel":  # a cancel is not downgraded to a stop
            self.store.update_job(job_id, wait=True, stop_request=wanted)
        # Answer with the status the owner moves the job to (stopping, cancelling), as a local stop does.
        deadline = time.monotonic() + 2 * self.settings.request_poll_seconds + 3.0
        job = self.get(job_id)
        while job.status.value == row["status"] and time.monotonic() < deadline:
            time.sleep(0.05)
            job = self.get(job_id)
        return job

    def _take_requests(self) -> None:
        """Stop or cancel the jobs other processes asked this one to (see `_ask_owner`)."""
        for job_id, wanted in self.store.stop_requests(os.getpid()):
            if not self.store.take_stop_request(job_id, wanted):
                continue  # changed meanwhile (a stop became a cancel): the next round takes the new one
            with self._lock:
                ours = job_id in self._jobs
            if not ours:
                continue
            try:
                self.stop(job_id, save=wanted != "cancel")
            except (JobConflict, JobNotFound) as exc:
                log.info("stop request for job %s not applied: %s", job_id, exc)

    def resume(self, job_id: str, secrets: dict[str, str] | None = None) -> Job:
        """A new job that continues from this one's checkpoint, linked by resumed_from."""
        job = self.get(job_id)
        if job.status not in RESUMABLE:
            raise JobConflict(f"job {job_id} is {job.status.value}; only stopped, interrupted or failed jobs resume")
        checkpoint = job.checkpoint or latest_checkpoint(job.output_dir)
        if checkpoint is None or not Path(checkpoint).is_dir():
            raise JobConflict(f"job {job_id} has no checkpoint to resume from")
        with self._lock:
            running = self._jobs.get(job_id)
            kept = dict(running.secrets) if running else {}
        public = {**job.config, "resume_from_checkpoint": checkpoint, "output_dir": None}
        config = JobConfig.from_parts(public, {**kept, **(secrets or {})})
        return self.submit(config, resumed_from=job_id)

    def get(self, job_id: str) -> Job:
        row = self.store.get_job(job_id)
        if row is None:
            raise JobNotFound(job_id)
        return Job.from_row(row)

    def list(self, status: list[JobStatus] | None = None, limit: int = 50, offset: int = 0) -> list[Job]:
        return [Job.from_row(r) for r in self.store.list_jobs([s.value for s in status or []], limit, offset)]

    def count(self, status: list[JobStatus] | None = None) -> int:
        return self.store.count_jobs([s.value for s in status or []])

    def metrics(self, job_id: str, max_points: int | None = None, since_step: int | None = None) -> list[dict]:
        """Metric records in step order, newer than since_step, downsampled to max_points.

        A downsampled view is kept per (job, max_points, since_step) and brought up
        to date with the rows added since the last call: a chart polling a live
        100k-step job pays for the new rows only, and one polling a finished job
        gets the cached answer.
        """
        with self._lock:
            running = self._jobs.get(job_id)
            seq = running.seq if running is not None else None
        if seq is None:
            seq = self.get(job_id).last_seq
        key = (job_id, max_points, since_step)
        with self._views_lock:
            cached = self._views.pop(key, None)
            if cached is not None and cached.seq == seq:
                self._views[key] = cached  # most recently used last
                return cached.records
            self.store.flush()
            chart = None
            if not max_points:
                records = self.store.metrics(job_id, since_step)
            else:
                chart = cached.chart if cached is not None and cached.chart is not None else ChartView(max_points)
                after = (chart.last[1], chart.last[0]) if chart.last is not None else None
                chart.extend(self.store.metric_index(job_id, since_step, after=after))
                rowids = [row[0] for row in chart.rows()]
                known = cached.by_rowid if cached is not None else {}  # most chosen rows were chosen last time
                by_rowid = {r: known[r] for r in rowids if r in known}
                by_rowid.update(self.store.metric_rows([r for r in rowids if r not in by_rowid]))
                records = [by_rowid[r] for r in rowids if r in by_rowid]  # (a row may be deleted meanwhile)
            self._views[key] = _View(seq, chart, records, by_rowid if chart is not None else {})
            # Bounded by the records held (~1 KB each) and by their number, least recently used out first;
            # the newest always stays.
            while len(self._views) > 1 and (
                len(self._views) > MAX_VIEWS or sum(max(1, len(v.records)) for v in self._views.values()) > VIEW_RECORDS
            ):
                self._views.pop(next(iter(self._views)))
        return records

    def subscribe(
        self, job_id: str, after_seq: int = 0, deliver: Callable[[JobEvent], None] | None = None
    ) -> Subscription:
        """Events after `after_seq`: the stored ones (`replay`, an iterator, or `get()`), then live ones, once each."""
        self.get(job_id)
        sub = Subscription(self, job_id, deliver)
        with self._lock:
            running = self._jobs.get(job_id)
            lock = running.lock if running else contextlib.nullcontext()
            with lock:
                # Holding the job's lock, no new event can be numbered: the store plus the
                # live feed from here on is exactly the stream, once.
                self.store.flush()
                row = self.store.get_job(job_id) or {}  # status and last_seq from one read
                upto = running.seq if running is not None else row.get("last_seq") or 0
                sub.replay = self._replay(job_id, after_seq, upto)
                if running is not None and not running.status.is_terminal:
                    running.subscribers.append(sub)
                elif running is None and row and JobStatus(row["status"]).is_live:
                    # Another process runs it (a `tunestudio train` beside this server): follow it in the store.
                    start = max(after_seq, upto)
                    threading.Thread(target=self._tail, args=(sub, start), name=f"tail-{job_id}", daemon=True).start()
        return sub

    def _tail(self, sub: Subscription, after_seq: int) -> None:
        """Deliver the events another process stores for the job, until its final status or `sub.close()`."""
        job_id = sub.job_id
        while not sub.closed and not self._closing:
            try:
                new = False
                for event in self._replay(job_id, after_seq, INT64_MAX):  # what is stored now, a page at a time
                    sub._push(event)
                    after_seq, new = event.seq, True
                    if event.is_end:
                        return
                if not new:
                    row = self.store.get_job(job_id)
                    if row is None or (JobStatus(row["status"]).is_terminal and row["last_seq"] <= after_seq):
                        return
                    if JobStatus(row["status"]).is_live and not child.pid_alive(row["owner_pid"] or 0):
                        return  # its process died: nothing more will come (the next start marks it interrupted)
                    sub._closed_event.wait(self.settings.request_poll_seconds)
            except Exception:
                log.exception("following job %s in the store failed", job_id)
                return

    def _replay(self, job_id: str, after_seq: int, upto: int, page: int = 2000) -> Iterator[JobEvent]:
        """The stored events in (after_seq, upto], a page at a time: a 100k-event replay is never all in memory."""
        while after_seq < upto:
            rows = self.store.events_after(job_id, after_seq, limit=page, upto=upto)
            if not rows:
                return
            for seq, kind, text, data in rows:
                yield JobEvent(seq, kind, text, data)
            after_seq = rows[-1][0]

    def delete(self, job_id: str, delete_artifacts: bool = False) -> None:
        job = self.get(job_id)
        if job.status.is_live:
            raise JobConflict(f"job {job_id} is {job.status.value}; stop or cancel it before deleting it")
        if delete_artifacts:
            for raw in {job.output_dir, str(self.settings.jobs_dir() / job_id)}:
                if raw and Path(raw).exists():
                    path = Path(raw).resolve()
                    if not path.is_relative_to(self.data_dir):
                        raise JobConflict(f"{path} is outside the data directory {self.data_dir}; not deleting it")
                    shutil.rmtree(path)
        self.store.delete_job(job_id)
        with self._lock:
            self._jobs.pop(job_id, None)
        with self._views_lock:
            for key in [k for k in self._views if k[0] == job_id]:
                del self._views[key]

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
                self._take_requests()
            except Exception:
                log.exception("reading stop requests failed")

    def _start_what_fits(self) -> None:
        """Start queued jobs while this process and the data directory's slots have room (under self._lock)."""
        while self._queue and len(self._running) < self.settings.max_concurrent_jobs:
            head = self._queue[0]
            if self._older_job_waits_elsewhere(head):
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
                    self._finish_without_worker(job_id, S.failed, f"could not start the job: {exc}")
            finally:
                if not started:
                    self._slots.release(slot)

    def _older_job_waits_elsewhere(self, job_id: str) -> bool:
        """Whether a job queued before this one waits in another live process on this data directory."""
        row = self.store.get_job(job_id)
        if row is None:
            return False
        me = os.getpid()
        return any(
            owner and owner != me and child.pid_alive(owner)
            for owner in self.store.queued_owners_before(row["created_at"])
        )

    def _note_waiting(self, job_id: str) -> None:
        """Say once in a queued job's stream why it has not started although this process has a free slot."""
        running = self._jobs.get(job_id)
        if running is None or running.waiting_noted:
            return
        running.waiting_noted = True
        message = "waiting: another process on this data directory runs as many jobs as max_concurrent_jobs allows"
        self.store.update_job(job_id, message=message)
        self._emit(job_id, "log", {"kind": "log", "level": "info", "message": message, "ts": time.time()})

    def _start(self, job_id: str, slot: int) -> bool:
        """Start a queued job's worker in the given slot; False if it was not started (the slot is free again)."""
        row = self.store.get_job(job_id)
        running = self._jobs[job_id]
        if row is None or JobStatus(row["status"]) is not S.queued:
            return False
        config = JobConfig.from_parts(row["config"], running.secrets)
        Path(row["log_path"]).parent.mkdir(parents=True, exist_ok=True)
        supervisor = Supervisor(
            config,
            lambda events: self._on_events(job_id, events),
            on_exit=lambda outcome: self._on_exit(job_id, outcome),
            target=self.worker_target,
            log_path=Path(row["log_path"]),
            stop_grace_seconds=self.settings.stop_grace_seconds,
            save_grace_seconds=self.settings.save_grace_seconds,
            kill_after_seconds=self.settings.kill_after_seconds,
            exit_after_terminal_seconds=self.settings.exit_after_terminal_seconds,
            prewarm=self.settings.prewarm,
        )
        running.supervisor = supervisor
        self._running.add(job_id)
        self._set_status(job_id, S.starting, message="starting the worker", started_at=time.time())
        try:
            supervisor.start()
        except Exception as exc:
            self._running.discard(job_id)
            self._finish_without_worker(job_id, S.failed, f"could not start the worker: {exc}")
            return False
        running.slot = slot
        self.store.update_job(job_id, worker_pid=supervisor.pid)
        return True

    # --- events from the pump -----------------------------------------------------
    def _on_events(self, job_id: str, events: list[Event]) -> None:
        """One burst from the pump, under one lock: its progress events go to the store as one write."""
        running = self._jobs[job_id]
        with running.lock:
            records: list[dict[str, Any]] = []
            for event in events:
                try:  # one bad event must not cost the rest of the burst
                    if isinstance(event, Progress):
                        records.append(event.record())
                        continue
                    if records:  # keep the stream in order: what came before this event is numbered first
                        records, batch = [], records
                        self._emit_locked(job_id, running, records=batch, progress=batch[-1])
                    self._on_other_event_locked(job_id, running, event)
                except Exception:
                    log.exception("job %s: handling a %s event failed", job_id, event.kind)
            if records:
                self._emit_locked(job_id, running, records=records, progress=records[-1])

    def _on_other_event_locked(self, job_id: str, running: _Running, event: Event) -> None:
        if isinstance(event, Phase):
            new = JobStatus(event.phase)
            if running.status in RUNNING and can_transition(running.status, new):
                self._set_status_locked(job_id, running, new, message=event.message or event.phase)
            else:
                self.store.update_job(job_id, phase=event.phase)
        elif isinstance(event, Completed):
            running.completed = event
        elif isinstance(event, Failed):
            running.failed = True
        self._emit_locked(job_id, running, [(event.kind, event.model_dump_json(exclude={"seq"}))])

    def _on_exit(self, job_id: str, outcome: Outcome) -> None:
        running = self._jobs[job_id]
        final = {"completed": S.completed, "stopped": S.stopped, "cancelled": S.cancelled, "failed": S.failed}[
            outcome.kind
        ]
        done = outcome.completed
        fields: dict[str, Any] = {"finished_at": time.time()}
        if done is not None:
            fields["final_metrics"] = done.metrics
            if done.output_dir:
                fields["output_dir"] = done.output_dir
        error = outcome.message if final is S.failed else None
        row = self.store.get_job(job_id) or {}
        checkpoint = (done.checkpoint if done else None) or latest_checkpoint(row.get("output_dir"))
        try:
            self._record_exit(job_id, running, final, outcome, error, checkpoint, fields)
        finally:
            with self._lock:
                self._running.discard(job_id)
                running.supervisor = None
                if running.slot is not None:
                    self._slots.release(running.slot)
                    running.slot = None
                self._wake.notify_all()

    def _record_exit(
        self, job_id: str, running: _Running, final: JobStatus, outcome: Outcome, error: str | None,
        checkpoint: str | None, fields: dict[str, Any],
    ) -> None:
        with running.lock:
            if final is S.failed and not running.failed:
                # The worker died without a word (a signal, an exit): say so in its stream.
                text = json.dumps({"kind": "failed", "message": outcome.message, "ts": time.time()})
                self._emit_locked(job_id, running, [("failed", text)])
            try:
                self._set_status_locked(job_id, running, final, message=outcome.message, error=error,
                                        checkpoint=checkpoint if final is not S.completed else None,
                                        wait=True, **fields)
            except IllegalTransition:
                log.error("job %s: outcome %s is illegal from %s", job_id, final, running.status)
                self._set_status_locked(job_id, running, S.failed, message=outcome.message,
                                        error=outcome.message, wait=True, **fields)
            running.subscribers.clear()

    # --- status and the event stream ------------------------------------------------
    def _finish_without_worker(self, job_id: str, status: JobStatus, message: str) -> None:
        running = self._jobs.setdefault(job_id, _Running())
        with running.lock:
            self._set_status_locked(job_id, running, status, message=message,
                                    error=message if status is S.failed else None,
                                    finished_at=time.time(), wait=True)
            running.subscribers.clear()

    def _set_status(self, job_id: str, status: JobStatus, **fields: Any) -> None:
        running = self._jobs[job_id]
        with running.lock:
            self._set_status_locked(job_id, running, status, **fields)

    def _set_status_locked(
        self, job_id: str, running: _Running, status: JobStatus, wait: bool = False, **fields: Any
    ) -> None:
        running.status = transition(running.status, status)
        message = fields.get("message", "")
        data = {"status": status.value, "message": message, "error": fields.get("error"), "ts": time.time()}
        if status in RUNNING:
            fields["phase"] = status.value
        # A final status is committed before anyone hears of it (wait=True).
        self._emit_locked(job_id, running, [("status", json.dumps(data))], wait=wait, status=status.value, **fields)

    def _emit(self, job_id: str, kind: str, data: dict[str, Any]) -> None:
        running = self._jobs[job_id]
        with running.lock:
            self._emit_locked(job_id, running, [(kind, json.dumps(data))])

    def _emit_locked(
        self,
        job_id: str,
        running: _Running,
        texts: Sequence[tuple[str, str]] = (),
        records: Sequence[dict[str, Any]] = (),
        wait: bool = False,
        **fields: Any,
    ) -> None:
        """Number events, store them with any job fields as one write, and fan them out.

        texts: (kind, JSON text) of events of any kind but progress; records: the
        metric records of progress events, which the store keeps as metrics rows.
        """
        stored = [(seq, kind, text) for seq, (kind, text) in enumerate(texts, start=running.seq + 1)]
        running.seq += len(stored)
        metrics = list(enumerate(records, start=running.seq + 1))
        running.seq += len(metrics)
        self.store.append(job_id, stored, metrics, last_seq=running.seq, **fields)
        if wait:
            self.store.flush()
        if not running.subscribers:
            return
        batch = [JobEvent(seq, kind, text) for seq, kind, text in stored]
        batch += [JobEvent(seq, "progress", data={"kind": "progress", **record}) for seq, record in metrics]
        for sub in list(running.subscribers):
            try:
                for event in batch:
                    sub._push(event)
            except Exception:
                log.exception("subscriber of job %s failed; dropping it", job_id)
                running.subscribers.remove(sub)

    def _unsubscribe(self, sub: Subscription) -> None:
        running = self._jobs.get(sub.job_id)
        if running is not None:
            with running.lock, contextlib.suppress(ValueError):
                running.subscribers.remove(sub)


__all__ = ["Job", "JobConflict", "JobEvent", "JobManager", "JobNotFound", "Subscription", "latest_checkpoint"]
