"""/api/jobs: the job resource API. Routes validate, call the manager, shape the answer."""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response
from sse_starlette import ServerSentEvent

from tunestudio.api import sse
from tunestudio.api.deps import ManagerDep, SettingsDep
from tunestudio.api.schemas import (
    ERRORS,
    EvalRowsOut,
    JobCreated,
    JobMessage,
    JobOut,
    JobPage,
    MessagesOut,
    MetricsOut,
    RenameRequest,
    ResumeRequest,
    StopRequest,
)
from tunestudio.api.security import confine_export, confine_paths
from tunestudio.config import JobConfig
from tunestudio.export_config import ExportOptions
from tunestudio.jobs import (
    INT64_MAX,  # query parameters must fit SQLite's integers
    ORDER_KEYS,
    JobStatus,
    Order,
)

router = APIRouter(prefix="/api/jobs", tags=["jobs"], responses=ERRORS)


@router.post("", status_code=201, response_model=JobCreated)
def create_job(
    config: JobConfig,
    manager: ManagerDep,
    settings: SettingsDep,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> JobCreated:
    """Queue a job. The same Idempotency-Key sent twice gives the same job."""
    confine_paths(config, settings)
    job = manager.submit(config, request_id=idempotency_key)
    return JobCreated(id=job.id, status=job.status)


@router.get("", response_model=JobPage)
def list_jobs(
    manager: ManagerDep,
    status: Annotated[list[JobStatus] | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=INT64_MAX)] = 0,
    live: Annotated[bool, Query(description="Only jobs that have not ended (queued or running), with status.")] = False,
) -> JobPage:
    """Jobs, newest first; a queued job says its place in the queue."""
    if live:
        status = [s for s in (status or list(JobStatus)) if s.is_live]
    jobs = manager.list(status, limit, offset)
    places = _queue_places(manager) if any(j.status is JobStatus.queued for j in jobs) else {}
    items = [JobOut.of(job, with_artefacts=False, queue_position=places.get(job.id)) for job in jobs]
    return JobPage(items=items, total=manager.count(status), limit=limit, offset=offset)


def _queue_places(manager: ManagerDep) -> dict[str, int]:
    """Queued jobs start oldest first (across processes on the data directory): 1 is the next to start."""
    queued = manager.list([JobStatus.queued], limit=100_000)
    return {job.id: place for place, job in enumerate(reversed(queued), start=1)}


@router.get("/{job_id}", response_model=JobOut)
def get_job(job_id: str, manager: ManagerDep) -> JobOut:
    job = manager.get(job_id)
    place = _queue_places(manager).get(job_id) if job.status is JobStatus.queued else None
    return JobOut.of(job, queue_position=place)


@router.patch("/{job_id}", response_model=JobOut)
def rename_job(job_id: str, body: RenameRequest, manager: ManagerDep) -> JobOut:
    """Set the job's name and notes (blank clears them)."""
    name = (body.name or "").strip() or None
    notes = (body.notes or "").strip() or None
    return JobOut.of(manager.rename(job_id, name, notes))


@router.post("/{job_id}/stop", response_model=JobOut)
def stop_job(job_id: str, manager: ManagerDep, body: StopRequest | None = None) -> JobOut:
    """Stop at the next step; save=true (the default) keeps a resumable checkpoint."""
    return JobOut.of(manager.stop(job_id, save=(body or StopRequest()).save))


@router.post("/{job_id}/cancel", response_model=JobOut)
def cancel_job(job_id: str, manager: ManagerDep) -> JobOut:
    return JobOut.of(manager.cancel(job_id))


@router.post("/{job_id}/exports", status_code=201, response_model=JobOut)
def export_job(
    job_id: str,
    options: ExportOptions,
    manager: ManagerDep,
    settings: SettingsDep,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> JobOut:
    """Queue an export of a finished job: merged, gguf (with an Ollama Modelfile), gguf-lora or hub.

    The answer is the export job (kind "export", source_job this job), watched like any job. A hub
    token (hf_token) goes to the worker only; it is never stored or returned.
    """
    confine_export(options, settings)
    return JobOut.of(manager.export(job_id, options, request_id=idempotency_key))


@router.post("/{job_id}/resume", status_code=201, response_model=JobOut)
def resume_job(job_id: str, manager: ManagerDep, body: ResumeRequest | None = None) -> JobOut:
    """A new job continuing from this one's checkpoint; the body may give the secrets again."""
    return JobOut.of(manager.resume(job_id, secrets=body.secrets() if body else None,
                                    num_processes=body.num_processes if body else None))


@router.delete("/{job_id}", status_code=204)
def delete_job(job_id: str, manager: ManagerDep, delete_artifacts: bool = False,
               delete_exports: bool = False) -> Response:
    """Forget a job; delete_artifacts removes what it wrote (only that). A job whose exports have files answers
    409 with `exports` (their ids) unless delete_exports: then they go with it."""
    manager.delete(job_id, delete_artifacts=delete_artifacts, delete_exports=delete_exports)
    return Response(status_code=204)


@router.get("/{job_id}/metrics", response_model=MetricsOut)
def job_metrics(
    job_id: str,
    manager: ManagerDep,
    max_points: Annotated[int | None, Query(ge=2, le=100_000)] = None,
    since_step: Annotated[int | None, Query(ge=0, le=INT64_MAX)] = None,
) -> Response:
    records = manager.metrics(job_id, max_points=max_points, since_step=since_step)
    # Plain records from the store: serialised directly, without a per-record model validation
    # (the declared response_model still documents the shape).
    return Response(json.dumps({"job_id": job_id, "records": records}), media_type="application/json")


@router.get("/{job_id}/messages", response_model=MessagesOut)
def job_messages(
    job_id: str,
    manager: ManagerDep,
    upto: Annotated[int | None, Query(ge=0, le=INT64_MAX, description="Only events up to this seq (a job's "
                                                                      "last_seq: then its stream goes on).")] = None,
    limit: Annotated[int, Query(ge=1, le=5000)] = 500,
) -> MessagesOut:
    """What a job said: its log, warning, failed and completed events (the newest `limit`), oldest first."""
    items = [JobMessage(seq=e.seq, kind=e.kind, ts=e.data.get("ts"), level=e.data.get("level"),
                        message=e.data.get("message") or "") for e in manager.messages(job_id, upto, limit)]
    return MessagesOut(job_id=job_id, items=items)


@router.get("/{job_id}/rows", response_model=EvalRowsOut)
def job_rows(
    job_id: str,
    manager: ManagerDep,
    order: Annotated[Order, Query(description="worst: highest loss (lowest metric) first; best: the other way.")]
    = "worst",
    by: Annotated[str, Query(pattern=f"^({'|'.join(ORDER_KEYS)})$",
                             description=f"What orders the rows: {', '.join(ORDER_KEYS)}.")] = "loss",
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    offset: Annotated[int, Query(ge=0, le=INT64_MAX)] = 0,
) -> EvalRowsOut:
    """A finished job's held-out rows one by one, with the reference, the model's answer, the loss and the
    generation metrics; 409 when the job has none (running, stopped, no held-out rows), saying why."""
    found = manager.eval_rows(job_id, by=by, order=order, limit=limit, offset=offset)
    return EvalRowsOut(job_id=job_id, by=by, order=order, total=found.total, ranked=found.ranked, offset=offset,
                       limit=limit, loss=found.loss, metrics=found.metrics, rows=found.rows)


@router.get("/{job_id}/events", response_class=Response, responses={200: {"content": {"text/event-stream": {}}}})
async def job_events(
    job_id: str,
    request: Request,
    manager: ManagerDep,
    settings: SettingsDep,
    last_event_id: Annotated[str | None, Header()] = None,
    after: Annotated[int | None, Query(ge=0, le=INT64_MAX,
                                       description="Same as Last-Event-ID, for clients that cannot set it.")] = None,
):
    """Server-Sent Events: every event after Last-Event-ID, then live ones, until the job ends."""
    manager.get(job_id)  # 404 before the stream starts
    start = sse.last_event_id(last_event_id, after)

    events = sse.job_events(manager, job_id, start, settings.sse_heartbeat_seconds, request.is_disconnected)

    async def items():
        async for event in events:
            if event is None:
                yield sse.heartbeat()
            else:
                # a status event says whether it is the last (the page closes its EventSource on it)
                data = json.dumps({**event.data, "terminal": True}) if event.is_end else event.text
                yield ServerSentEvent(data=data, id=str(event.seq), event=event.kind)

    return sse.response(items(), settings.sse_retry_ms)


@router.get("/{job_id}/plot.png", response_class=Response, responses={200: {"content": {"image/png": {}}}})
def job_plot(
    job_id: str,
    manager: ManagerDep,
    theme: Annotated[str, Query(pattern="^(light|dark)$")] = "light",
) -> Response:
    """The loss plot: raw points, a moving average, eval loss; light or dark."""
    from tunestudio.api import plot  # matplotlib loads on the first plot, not at start-up

    job = manager.get(job_id)
    png = plot.loss_plot(manager.metrics(job_id, max_points=2000), job.status.value, theme)
    return Response(png, media_type="image/png", headers={"Cache-Control": "no-store"})
