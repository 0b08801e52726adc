"""/api/train/*: the seed's single-job surface, a thin view over the same manager.

"The current job" is the most recently started job (or, before any has
started, the newest one) created since the last reset. Every `job_id` here is
that job's id under /api/jobs.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from sse_starlette import ServerSentEvent

from tunestudio import paths
from tunestudio.api import sse
from tunestudio.api.deps import ManagerDep, SettingsDep
from tunestudio.api.errors import ApiError
from tunestudio.api.hardware import hardware
from tunestudio.api.security import confine_paths
from tunestudio.config import JobConfig, format_validation_error, summary
from tunestudio.jobs import Job, JobConflict, JobManager, JobStatus

log = logging.getLogger(__name__)
router = APIRouter(prefix="/api/train", tags=["train (seed-compatible)"])
S = JobStatus

SEED_PHASE = {
    S.queued: "configuring", S.starting: "configuring", S.loading_model: "loading_model",
    S.loading_dataset: "loading_dataset", S.training: "training", S.saving: "training",
    S.stopping: "training", S.cancelling: "training", S.completed: "completed", S.failed: "error",
    S.interrupted: "error", S.stopped: "stopped", S.cancelled: "stopped",
}


class StartResponse(BaseModel):
    job_id: str | None
    status: str  # "queued" | "error"
    message: str
    error: str | None = None


class StopBody(BaseModel):
    save: bool = True


def _reset_at(request: Request) -> float:
    return getattr(request.app.state, "train_reset_at", 0.0)


def current_job(manager: JobManager, request: Request) -> Job | None:
    since = _reset_at(request)
    recent = [j for j in manager.list(limit=50) if j.created_at >= since]
    started = [j for j in recent if j.started_at is not None]
    if started:
        return max(started, key=lambda j: j.started_at or 0)
    return recent[0] if recent else None


SEED_ONLY = ("split", "use_lora", "project_root")  # the seed's own fields, mapped or dropped below


def seed_to_config(body: dict[str, Any]) -> tuple[JobConfig, list[str]]:
    """The seed's request fields, mapped onto JobConfig; also the names of the fields it ignored.

    As the seed's own client expects: `null` for any field means "use the default", and fields this server
    does not know (newer clients add some) are ignored rather than refused. `split` and `use_lora` are the
    seed's own names. /api/jobs stays strict.
    """
    data = {key: value for key, value in body.items() if value is not None}
    split = data.pop("split", None)
    if split and not data.get("train_split"):
        data["train_split"] = split
    use_lora = data.pop("use_lora", None)
    if use_lora is False and not data.get("training_type"):
        data["training_type"] = "full"
    data.pop("project_root", None)  # the seed sent its own install path; meaningless here
    ignored = sorted(key for key in data if key not in JobConfig.model_fields)
    for key in ignored:
        del data[key]
    return JobConfig.model_validate(data), ignored


@router.post("/start", response_model=StartResponse,
             responses={422: {"model": StartResponse, "description": "The seed's error shape: status 'error'"}})
def start(
    manager: ManagerDep,
    settings: SettingsDep,
    body: Annotated[dict[str, Any], Body(description="The seed's training request (JobConfig fields, plus "
                                                      "`split` and `use_lora`).")],
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> Any:
    try:
        config, ignored = seed_to_config(body)
        confine_paths(config, settings)
    except ValidationError as exc:
        errors = format_validation_error(exc)
        message = summary(errors)
        return JSONResponse(StartResponse(job_id=None, status="error", message="invalid training request",
                                          error=message).model_dump(), status_code=422)
    except ApiError as exc:
        return JSONResponse(StartResponse(job_id=None, status="error", message="invalid training request",
                                          error=exc.message).model_dump(), status_code=exc.status)
    warnings = []
    if ignored:
        shown = ", ".join(name[:60] for name in ignored[:20]) + (f" and {len(ignored) - 20} more"
                                                                  if len(ignored) > 20 else "")
        warnings.append(f"/api/train/start ignored fields this server does not know: {shown}")
        log.warning("/api/train/start: ignored unknown fields %s", shown)
    try:
        job = manager.submit(config, request_id=idempotency_key, warnings=warnings)
    except paths.PathRefused as exc:
        return JSONResponse(StartResponse(job_id=None, status="error", message="invalid training request",
                                          error=str(exc)).model_dump(), status_code=422)
    position = len(manager.list([S.queued], limit=1000))
    return StartResponse(job_id=job.id, status="queued",
                         message="training queued" + (f" ({position} in the queue)" if position > 1 else "")
                         + (f"; {warnings[0].removeprefix('/api/train/start ')}" if warnings else ""))


@router.post("/stop")
def stop(request: Request, manager: ManagerDep, body: StopBody | None = None) -> dict[str, Any]:
    job = current_job(manager, request)
    if job is None or job.status.is_terminal:
        return {"success": False, "job_id": job.id if job else None, "message": "no training is running"}
    try:
        job = manager.stop(job.id, save=(body or StopBody()).save)
    except JobConflict as exc:
        return {"success": False, "job_id": job.id, "message": str(exc)}
    return {"success": True, "job_id": job.id, "message": job.message}


@router.post("/reset")
def reset(request: Request, manager: ManagerDep) -> dict[str, Any]:
    job = current_job(manager, request)
    if job is not None and job.status.is_live:
        raise ApiError(409, "conflict", f"job {job.id} is {job.status.value}; stop it before resetting")
    request.app.state.train_reset_at = time.time()
    return {"success": True, "message": "reset; no current job"}


def _history(records: list[dict[str, Any]]) -> dict[str, list]:
    train = [r for r in records if r.get("loss") is not None]
    grads = [r for r in train if r.get("grad_norm") is not None]
    evals = [r for r in records if r.get("eval_loss") is not None]
    return {
        "steps": [r["step"] for r in train],
        "loss": [r["loss"] for r in train],
        "lr": [r.get("learning_rate") for r in train],
        "grad_norm": [r["grad_norm"] for r in grads],
        "grad_norm_steps": [r["step"] for r in grads],
        "eval_loss": [r["eval_loss"] for r in evals],
        "eval_steps": [r["step"] for r in evals],
    }


@router.get("/status")
def status(request: Request, manager: ManagerDep) -> dict[str, Any]:
    job = current_job(manager, request)
    if job is None:
        return {"job_id": None, "phase": "idle", "is_training_running": False, "eval_enabled": False,
                "message": "idle", "error": None,
                "details": {"epoch": None, "step": 0, "total_steps": 0, "loss": None, "learning_rate": None},
                "metric_history": _history([])}
    records = manager.metrics(job.id, max_points=2000)
    history = _history(records)
    progress = job.progress or {}
    last_train = next((r for r in reversed(records) if r.get("loss") is not None), {})
    return {
        "job_id": job.id,
        "phase": SEED_PHASE[job.status],
        "is_training_running": job.status.is_live,
        "eval_enabled": bool(history["eval_loss"]) or (job.spec.trains and job.train_config.eval_steps > 0),
        "message": job.message,
        "error": job.error,
        "details": {"epoch": progress.get("epoch"), "step": progress.get("step", 0),
                    "total_steps": progress.get("total_steps", 0), "loss": last_train.get("loss"),
                    "learning_rate": last_train.get("learning_rate")},
        "metric_history": history,
    }


@router.get("/metrics")
def metrics(request: Request, manager: ManagerDep) -> dict[str, Any]:
    job = current_job(manager, request)
    history = _history(manager.metrics(job.id, max_points=2000) if job else [])
    return {
        "loss_history": history["loss"],
        "lr_history": history["lr"],
        "step_history": history["steps"],
        "grad_norm_history": history["grad_norm"],
        "grad_norm_step_history": history["grad_norm_steps"],
        "current_loss": history["loss"][-1] if history["loss"] else None,
        "current_lr": history["lr"][-1] if history["lr"] else None,
        "current_step": history["steps"][-1] if history["steps"] else 0,
    }


@router.get("/progress")
async def progress(
    request: Request,
    manager: ManagerDep,
    settings: SettingsDep,
    last_event_id: Annotated[str | None, Header()] = None,
):
    """The seed's progress stream: id = step; events progress, heartbeat, complete, error."""
    job = current_job(manager, request)
    if job is None:
        raise ApiError(404, "not_found", "no current training job")
    after_step = sse.last_event_id(last_event_id, None)

    events = sse.job_events(manager, job.id, 0, settings.sse_heartbeat_seconds, request.is_disconnected)

    async def items():
        async for event in events:
            if event is None:
                yield sse.heartbeat()
            elif event.kind == "progress" and event.data.get("loss") is not None:
                if event.data["step"] > after_step:
                    yield ServerSentEvent(data=event.text, id=str(event.data["step"]), event="progress")
            elif event.is_end:
                final = event.data["status"]
                kind = "error" if final in ("failed", "interrupted") else "complete"
                yield ServerSentEvent(data=json.dumps(event.data), event=kind)

    return sse.response(items(), settings.sse_retry_ms)


@router.get("/hardware")
def train_hardware() -> dict[str, Any]:
    return hardware()
