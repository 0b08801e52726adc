"""The jobs this process queued or runs: their status, the worker's events applied, how each ended.

A status changes here and nowhere else, always through `status.transition`,
and every change is a `StatusEvent` in the job's stream. The pump thread of a
job's supervisor calls `on_events` (one burst at a time) and `record_exit`.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

from tunestudio.checkpoints import latest_checkpoint
from tunestudio.config import JobConfig
from tunestudio.events import Event, Failed, Log, Phase, Progress, StatusEvent
from tunestudio.export_config import ExportConfig
from tunestudio.jobs.status import RUNNING, IllegalTransition, JobStatus, can_transition, transition
from tunestudio.jobs.store import Store
from tunestudio.jobs.stream import Feed
from tunestudio.jobs.supervisor import Outcome, Supervisor

log = logging.getLogger(__name__)
S = JobStatus
_FINAL = {"completed": S.completed, "stopped": S.stopped, "cancelled": S.cancelled, "failed": S.failed}


@dataclass
class Running:
    """What this process keeps in memory about one of its jobs."""

    feed: Feed
    status: JobStatus = S.queued
    config: JobConfig | ExportConfig | None = None  # the validated config, for jobs this process submitted
    supervisor: Supervisor | None = None
    launched: bool = False  # its supervisor's worker was started: a stop signals it from then on
    secrets: dict[str, str] = field(default_factory=dict)
    failed: bool = False  # the worker sent a Failed event
    slot: int | None = None  # the job slot (see slots.py) its worker holds
    waiting_noted: bool = False  # told its stream it waits for another process's slot
    deleted: bool = False  # deleted once its status was terminal, before its exit handler freed its slot


class Tracker:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.jobs: dict[str, Running] = {}

    def track(self, job_id: str, last_seq: int = 0, **fields: Any) -> Running:
        running = self.jobs[job_id] = Running(Feed(job_id, self.store, last_seq), **fields)
        return running

    # --- status ------------------------------------------------------------------
    def set_status(self, job_id: str, status: JobStatus, **fields: Any) -> None:
        running = self.jobs[job_id]
        with running.feed.lock:
            self._set_status_locked(running, status, **fields)

    def finish_without_worker(self, job_id: str, status: JobStatus, message: str, last_seq: int = 0) -> None:
        """End a job that has no worker (cancelled while queued, could not start)."""
        running = self.jobs.get(job_id) or self.track(job_id, last_seq)
        with running.feed.lock:
            self._set_status_locked(running, status, message=message, error=message if status is S.failed else None,
                                    finished_at=time.time(), wait=True)
            running.feed.end()

    def _set_status_locked(self, running: Running, status: JobStatus, wait: bool = False, **fields: Any) -> None:
        running.status = transition(running.status, status)
        event = StatusEvent(seq=0, status=status.value, message=fields.get("message", ""), error=fields.get("error"))
        if status in RUNNING:
            fields["phase"] = status.value
        # A final status is committed before anyone hears of it (wait=True).
        running.feed.emit([event], wait=wait, status=status.value, **fields)

    # --- from the pump ---------------------------------------------------------------
    def interrupt(self, row: dict[str, Any]) -> None:
        """A live job whose process died (found at start-up): interrupted, with its newest complete checkpoint."""
        message = f"interrupted: the process running this job ended while it was {row['status']}"
        self.track(row["id"], row["last_seq"], status=JobStatus(row["status"]))
        self.set_status(row["id"], JobStatus.interrupted, message=message, finished_at=time.time(),
                        checkpoint=latest_checkpoint(row["output_dir"]))
        self.jobs.pop(row["id"], None)

    def note_waiting(self, job_id: str) -> None:
        """Say once in a queued job's stream why it has not started although its process has a free slot."""
        running = self.jobs.get(job_id)
        if running is None or running.waiting_noted:
            return
        running.waiting_noted = True
        message = "waiting: another process on this data directory runs as many jobs as max_concurrent_jobs allows"
        with running.feed.lock:
            running.feed.emit([Log(seq=0, level="info", message=message)], message=message)

    def on_events(self, job_id: str, events: list[Event]) -> None:
        """One burst from the pump, under one lock: its progress events go to the store as one write."""
        running = self.jobs[job_id]
        with running.feed.lock:
            records: list[dict[str, Any]] = []
            for event in events:
                try:  # one bad event must not cost the rest of the burst
                    if isinstance(event, Progress):
                        records.append(event.record())
                        continue
                    if records:  # keep the stream in order: what came before this event is numbered first
                        records, batch = [], records
                        running.feed.emit(records=batch, progress=batch[-1])
                    self._on_other_event_locked(running, event)
                except Exception:
                    log.exception("job %s: handling a %s event failed", job_id, event.kind)
            if records:
                running.feed.emit(records=records, progress=records[-1])

    def _on_other_event_locked(self, running: Running, event: Event) -> None:
        if isinstance(event, Phase):
            new = JobStatus(event.phase) if event.phase in JobStatus.__members__ else None  # else a step in a phase
            if new is not None and running.status in RUNNING and can_transition(running.status, new):
                self._set_status_locked(running, new, message=event.message or event.phase)
            elif new is None and running.status in RUNNING:
                counted = f" ({event.done} / {event.total})" if event.total else ""
                self.store.update_job(running.feed.job_id, phase=event.phase, message=f"{event.message}{counted}")
            else:
                self.store.update_job(running.feed.job_id, phase=event.phase)
        elif isinstance(event, Failed):
            running.failed = True
        running.feed.emit([event])

    def record_exit(self, job_id: str, outcome: Outcome) -> None:
        """The worker is gone: its final status (committed), and the end of its stream."""
        running = self.jobs[job_id]
        final = _FINAL[outcome.kind]
        done = outcome.completed
        fields: dict[str, Any] = {"finished_at": time.time()}
        row = self.store.get_job(job_id) or {}
        if done is not None:
            fields["final_metrics"] = done.metrics
            fields["result"] = done.model_dump(mode="json", include={"samples", "evaluation", "best", "held_out",
                                                                     "storage", "resolved"})
            self._inherit_base_eval_loss(fields["result"], row.get("resumed_from"))
            if done.benchmarks is not None:  # a bench job's figures (worker/bench.py)
                fields["result"]["benchmarks"] = done.benchmarks
            if done.output_dir:
                fields["output_dir"] = done.output_dir
        checkpoint = (done.checkpoint if done else None) or latest_checkpoint(row.get("output_dir"))
        error = outcome.message if final is S.failed else None
        with running.feed.lock:
            if final is S.failed and not running.failed:
                # The worker died without a word (a signal, an exit): say so in its stream.
                running.feed.emit([Failed(seq=0, message=outcome.message)])
            try:
                self._set_status_locked(running, final, message=outcome.message, error=error,
                                        checkpoint=checkpoint if final is not S.completed else None,
                                        wait=True, **fields)
            except IllegalTransition:
                log.error("job %s: outcome %s is illegal from %s", job_id, final, running.status)
                self._set_status_locked(running, S.failed, message=outcome.message,
                                        error=outcome.message, wait=True, **fields)
            running.feed.end()

    def _inherit_base_eval_loss(self, result: dict[str, Any], resumed_from: str | None) -> None:
        """A resumed job does not measure the base model's eval loss (its training starts from a checkpoint); the
        first job of its chain did, at step 0: that is its evaluation's "before" (and perplexity's)."""
        metrics = (result.get("evaluation") or {}).get("metrics") or {}
        loss = metrics.get("eval_loss")
        if not resumed_from or loss is None or loss.get("before") is not None:
            return
        base, job_id, seen = None, resumed_from, set()
        while base is None and job_id and job_id not in seen:
            seen.add(job_id)
            base = self.store.base_eval_loss(job_id)
            job_id = (self.store.get_job(job_id) or {}).get("resumed_from")
        if base is None:
            return
        loss["before"] = base
        if "perplexity" in metrics and math.isfinite(base):
            metrics["perplexity"]["before"] = math.exp(min(base, 700.0))  # as worker/train/evaluation.py computes it
