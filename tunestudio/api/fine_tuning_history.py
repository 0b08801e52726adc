"""What an OpenAI fine-tuning job has to show of its past: events, checkpoints, and the metrics CSV.

All of it is read from the studio jobs of its resume chain (api/fine_tuning.py `Chain`), oldest first:
- events: each job's stored stream (status changes, logs, warnings, metric records, the worker's end),
  listed newest first as OpenAI does; an event is `ftevent-<studio job id>-<seq>`, so `after` is a place in
  the chain's stream. The worker's phases are left out (its status events say the same).
- checkpoints: the complete `checkpoint-N` folders in each job's output folder, newest first;
  `ftckpt-<studio job id>-<N>`, with the metrics logged at step N.
- results: every metric record of the chain as CSV rows (OpenAI's `step,train_loss,valid_loss,...`).
"""

from __future__ import annotations

import csv
import io
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from tunestudio.api.errors import ApiError
from tunestudio.api.fine_tuning import Chain
from tunestudio.checkpoints import CHECKPOINT, TRAINER_STATE, is_complete
from tunestudio.inference import fine_tuned_name
from tunestudio.jobs import Job, JobEvent, JobManager

EVENT_PREFIX = "ftevent-"
CHECKPOINT_PREFIX = "ftckpt-"
_LEVELS: dict[str, Literal["info", "warn", "error"]] = {"debug": "info", "info": "info", "warning": "warn",
                                                        "error": "error"}
CSV_COLUMNS = ("step", "epoch", "train_loss", "valid_loss", "train_mean_token_accuracy",
               "valid_mean_token_accuracy", "learning_rate", "grad_norm", "num_tokens", "elapsed_seconds")


class Event(BaseModel):
    id: str
    object: Literal["fine_tuning.job.event"] = "fine_tuning.job.event"
    created_at: int
    level: Literal["info", "warn", "error"]
    message: str
    data: dict[str, Any] | None = None
    type: Literal["message", "metrics"] = "message"


class EventList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Event]
    has_more: bool


class CheckpointMetrics(BaseModel):
    step: float | None = None
    train_loss: float | None = None
    train_mean_token_accuracy: float | None = None
    valid_loss: float | None = None
    valid_mean_token_accuracy: float | None = None
    full_valid_loss: float | None = None
    full_valid_mean_token_accuracy: float | None = None


class Checkpoint(BaseModel):
    id: str
    object: Literal["fine_tuning.job.checkpoint"] = "fine_tuning.job.checkpoint"
    created_at: int
    fine_tuned_model_checkpoint: str
    fine_tuning_job_id: str
    metrics: CheckpointMetrics
    step_number: int


class CheckpointList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Checkpoint]
    has_more: bool
    first_id: str | None = None
    last_id: str | None = None


# --- events -----------------------------------------------------------------------------------------
def _metric_data(data: dict[str, Any]) -> dict[str, Any]:
    extra = data.get("extra") or {}
    out = {"step": data.get("step"), "total_steps": data.get("total_steps"), "train_loss": data.get("loss"),
           "valid_loss": data.get("eval_loss"), "learning_rate": data.get("learning_rate"),
           "epoch": data.get("epoch"), "num_tokens": data.get("num_tokens"),
           "train_mean_token_accuracy": extra.get("mean_token_accuracy"),
           "valid_mean_token_accuracy": extra.get("eval_mean_token_accuracy")}
    return {k: v for k, v in out.items() if v is not None}


def _metric_message(data: dict[str, Any]) -> str:
    parts = [f"{name}={data[key]:.4f}" for key, name in (("loss", "training loss"), ("eval_loss", "validation loss"))
             if data.get(key) is not None]
    return f"Step {data.get('step')}/{data.get('total_steps')}: {', '.join(parts) or 'no loss logged'}"


def to_event(job: Job, event: JobEvent) -> Event | None:
    """One stored event of a studio job as OpenAI's; None for what OpenAI's stream has no place for."""
    data = event.data
    ident, created = f"{EVENT_PREFIX}{job.id}-{event.seq}", int(data.get("ts") or job.created_at)
    kind = event.kind
    if kind == "progress":
        return Event(id=ident, created_at=created, level="info", message=_metric_message(data), type="metrics",
                     data=_metric_data(data))
    if kind == "status":
        status = str(data.get("status"))
        level = "error" if status == "failed" else "warn" if status in ("cancelled", "interrupted") else "info"
        text = data.get("error") or data.get("message") or ""
        message = f"{status}: {text}" if text and text != status else status
        return Event(id=ident, created_at=created, level=level, message=message, data={"status": status})
    if kind in ("log", "warning", "failed"):
        level = "warn" if kind == "warning" else "error" if kind == "failed" else _LEVELS.get(data.get("level"), "info")
        return Event(id=ident, created_at=created, level=level, message=str(data.get("message", "")))
    if kind == "completed":
        step = data.get("global_step")
        message = (f"training paused at step {step}; a checkpoint was saved" if data.get("stopped")
                   else f"training completed at step {step}")
        return Event(id=ident, created_at=created, level="info", message=message)
    return None  # phases: the status events say the same


def _stored(manager: JobManager, job_id: str) -> Iterator[JobEvent]:
    """The job's stored events, oldest first (a live job's later events are not waited for)."""
    with manager.subscribe(job_id, 0) as subscription:
        yield from subscription.replay


def _place(chain: Chain, ident: str, prefix: str, what: str) -> tuple[int, int]:
    """(index of its studio job in the chain, number) of an event or checkpoint id of this chain; else a 404."""
    studio_id, _, number = ident.removeprefix(prefix).rpartition("-")
    index = next((i for i, job in enumerate(chain.jobs) if job.id == studio_id), None)
    if not ident.startswith(prefix) or index is None or not number.isdigit():
        raise ApiError(404, "not_found", f"no {what} {ident!r} in fine-tuning job {chain.id}", field="after")
    return index, int(number)


def events_page(manager: JobManager, chain: Chain, after: str | None, limit: int) -> EventList:
    """Up to `limit` events older than `after` (newest first)."""
    before = _place(chain, after, EVENT_PREFIX, "event") if after else None
    kept: deque[Event] = deque(maxlen=limit + 1)
    for index, job in enumerate(chain.jobs):
        if before is not None and index > before[0]:
            break
        for stored in _stored(manager, job.id):
            if before is not None and index == before[0] and stored.seq >= before[1]:
                break
            if (event := to_event(job, stored)) is not None:
                kept.append(event)
    newest_first = list(reversed(kept))
    return EventList(data=newest_first[:limit], has_more=len(newest_first) > limit)


# --- checkpoints ---------------------------------------------------------------------------------------
def _folders(job: Job) -> list[tuple[int, Path]]:
    root = Path(job.output_dir or "")
    try:
        found = [(int(m.group(1)), p) for p in root.iterdir() if (m := CHECKPOINT.match(p.name))]
    except OSError:
        return []
    return sorted((step, path) for step, path in found if is_complete(path))


def _at_step(records: list[dict[str, Any]], step: int) -> CheckpointMetrics:
    metrics = CheckpointMetrics(step=step)
    for record in records:
        if record.get("step") != step:
            continue
        extra = record.get("extra") or {}
        if record.get("loss") is not None:
            metrics.train_loss = record["loss"]
            metrics.train_mean_token_accuracy = extra.get("mean_token_accuracy")
        if record.get("eval_loss") is not None:
            metrics.valid_loss = metrics.full_valid_loss = record["eval_loss"]
            metrics.valid_mean_token_accuracy = extra.get("eval_mean_token_accuracy")
            metrics.full_valid_mean_token_accuracy = metrics.valid_mean_token_accuracy
    return metrics


def checkpoints_page(manager: JobManager, chain: Chain, after: str | None, limit: int) -> CheckpointList:
    """Up to `limit` checkpoints older than `after` (newest first)."""
    before = _place(chain, after, CHECKPOINT_PREFIX, "checkpoint") if after else None
    found: list[Checkpoint] = []
    for index, job in enumerate(chain.jobs):
        folders = [(step, path) for step, path in _folders(job)
                   if before is None or index < before[0] or (index == before[0] and step < before[1])]
        if not folders or (before is not None and index > before[0]):
            continue
        records = manager.metrics(job.id)
        name = fine_tuned_name(job)
        for step, path in folders:
            try:
                created = int((path / TRAINER_STATE).stat().st_mtime)
            except OSError:
                continue
            found.append(Checkpoint(id=f"{CHECKPOINT_PREFIX}{job.id}-{step}", created_at=created,
                                    fine_tuned_model_checkpoint=f"{name}:ckpt-step-{step}",
                                    fine_tuning_job_id=chain.id, metrics=_at_step(records, step), step_number=step))
    newest_first = list(reversed(found))
    page = newest_first[:limit]
    return CheckpointList(data=page, has_more=len(newest_first) > limit,
                          first_id=page[0].id if page else None, last_id=page[-1].id if page else None)


# --- the results file -----------------------------------------------------------------------------------
def results_csv(manager: JobManager, chain: Chain) -> str:
    """Every metric record of the chain, one CSV row each (an eval record: its valid_ columns)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for job in chain.jobs:
        for record in manager.metrics(job.id):
            extra = record.get("extra") or {}
            values = {**record, "train_loss": record.get("loss"), "valid_loss": record.get("eval_loss"),
                      "train_mean_token_accuracy": extra.get("mean_token_accuracy"),
                      "valid_mean_token_accuracy": extra.get("eval_mean_token_accuracy")}
            writer.writerow(["" if values.get(c) is None else values[c] for c in CSV_COLUMNS])
    return out.getvalue()
