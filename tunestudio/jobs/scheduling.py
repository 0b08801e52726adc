"""The manager's scheduler: the thread that starts queued jobs' workers as slots allow, and what happens when a
worker exits (`Scheduling`, a part of `JobManager`: it works on the manager's queue, running set, slots, tracker
and store under the manager's `_lock`).

A job is prepared under `_lock` (its slot, its supervisor, status `starting`) and its worker started with no lock
held (`_launch`: a torchrun launcher or a Ray driver may take seconds), so stop, submit and the views go on
meanwhile; a stop asked before the process runs sets the status only, and `_launch` passes it on once the worker
runs (`Running.launched`, read and set under `_lock`, so exactly one of them signals).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from tunestudio.jobs import admission, artefacts
from tunestudio.jobs.models import Job, JobConflict, JobNotFound
from tunestudio.jobs.status import JobStatus
from tunestudio.jobs.supervisor import Outcome, Supervisor

if TYPE_CHECKING:
    from tunestudio.jobs.owners import Owners
    from tunestudio.jobs.slots import Slots
    from tunestudio.jobs.store import Store
    from tunestudio.jobs.tracker import Running, Tracker
    from tunestudio.settings import Settings
    from tunestudio.worker.child import WorkerEntry

log = logging.getLogger(__name__)
S = JobStatus


class Scheduling:
    """The scheduler thread's half of JobManager (which sets every attribute below in its __init__)."""

    settings: Settings
    worker_target: WorkerEntry
    _lock: threading.RLock
    _wake: threading.Condition
    _closing: bool
    _queue: deque[str]
    _running: set[str]
    _jobs: dict[str, Running]
    _store: Store
    _slots: Slots
    _owners: Owners
    _tracker: Tracker

    stop: Callable[..., Job]  # JobManager.stop

    def _schedule_loop(self) -> None:
        # This thread must outlive every worker it started (PR_SET_PDEATHSIG): nothing may end it but close().
        while True:
            prepared: list[tuple[str, Supervisor]] = []
            with self._lock:
                if self._closing:
                    return
                try:
                    prepared = self._prepare_what_fits()
                except Exception:  # a full disk, a locked database...: try again next round
                    log.exception("scheduling failed")
            # The workers start with no lock held: a process (a torchrun launcher, a Ray driver) can take seconds
            # to start, and stop, submit and the views go on meanwhile.
            for job_id, supervisor in prepared:
                self._launch(job_id, supervisor)
            with self._lock:
                if self._closing:
                    return
                if not prepared:
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

    def _prepare_what_fits(self) -> list[tuple[str, Supervisor]]:
        """Queued jobs this process and the data directory's slots have room for, each with its slot and its
        supervisor (not started yet), now `starting` (under self._lock)."""
        prepared: list[tuple[str, Supervisor]] = []
        while self._queue and len(self._running) < self.settings.max_concurrent_jobs:
            head = self._queue[0]
            if self._owners.older_job_waits_elsewhere(head):
                self._tracker.note_waiting(head)  # first come, first served across processes too
                break
            slot = self._slots.acquire(self.settings.max_concurrent_jobs)
            if slot is None:  # another process on this data directory holds every slot: retry next round
                self._tracker.note_waiting(head)
                break
            job_id = self._queue.popleft()
            supervisor = None
            try:
                supervisor = self._prepare(job_id, slot)
            except Exception as exc:  # e.g. a stored config this version refuses: fail that job only
                log.exception("starting job %s failed", job_id)
                self._running.discard(job_id)
                with contextlib.suppress(Exception):
                    self._tracker.finish_without_worker(job_id, S.failed, f"could not start the job: {exc}")
            if supervisor is None:
                self._slots.release(slot)
                self._jobs[job_id].slot = None
            else:
                prepared.append((job_id, supervisor))
        return prepared

    def _prepare(self, job_id: str, slot: int) -> Supervisor | None:
        """A queued job's supervisor, holding `slot` (the job `starting`); None if it is not to start (the caller
        frees the slot)."""
        row = self._store.get_job(job_id)
        running = self._jobs[job_id]
        if row is None or JobStatus(row["status"]) is not S.queued:
            return None
        # A job another process queued (adopted at start-up) is validated from its stored config here.
        config = running.config or admission.stored_config(row, running.secrets)
        Path(row["log_path"]).parent.mkdir(parents=True, exist_ok=True)
        supervisor = Supervisor.for_job(config, self.settings, self.worker_target, Path(row["log_path"]),
                                        lambda events: self._tracker.on_events(job_id, events),
                                        lambda outcome: self._on_exit(job_id, outcome))
        if (refused := artefacts.take(job_id, row["output_dir"])) is not None:
            self._store.update_job(job_id, output_dir=None)  # it never took the folder: nothing there is its own
            self._tracker.finish_without_worker(job_id, S.failed, refused)
            return None
        running.supervisor, running.slot, running.launched = supervisor, slot, False
        self._running.add(job_id)
        self._tracker.set_status(job_id, S.starting, message="starting the worker", started_at=time.time())
        return supervisor

    def _launch(self, job_id: str, supervisor: Supervisor) -> None:
        """Start a prepared job's worker (no lock held); a stop asked meanwhile is passed on once it runs."""
        running = self._jobs[job_id]
        try:
            supervisor.start()
        except Exception as exc:
            log.exception("starting job %s's worker failed", job_id)
            self._free(job_id)
            with contextlib.suppress(Exception):
                self._tracker.finish_without_worker(job_id, S.failed, f"could not start the worker: {exc}")
            return
        with self._lock:
            running.launched = True
            asked = running.status if running.status in (S.stopping, S.cancelling) else None
        with contextlib.suppress(Exception):
            self._store.update_job(job_id, worker_pid=supervisor.pid)
        if asked is not None:  # stop() found no worker to tell yet
            supervisor.stop(save=asked is S.stopping)

    def _on_exit(self, job_id: str, outcome: Outcome) -> None:
        try:
            artefacts.seal(job_id, (self._store.get_job(job_id) or {}).get("output_dir"))
            self._tracker.record_exit(job_id, outcome)
        finally:
            self._free(job_id)

    def _free(self, job_id: str) -> None:
        """The job no longer runs here: its supervisor dropped, its slot released, the scheduler woken."""
        with self._lock:
            running = self._jobs[job_id]
            self._running.discard(job_id)
            running.supervisor = None
            if running.slot is not None:
                self._slots.release(running.slot)
                running.slot = None
            if running.deleted:  # deleted while its end was being recorded (JobManager.delete)
                self._jobs.pop(job_id, None)
            self._wake.notify_all()
