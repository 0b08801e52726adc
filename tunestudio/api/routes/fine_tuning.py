"""/v1/fine_tuning/jobs: OpenAI's fine-tuning jobs as a view over the studio's train jobs (api/fine_tuning.py).

Create turns the request into a `JobConfig` ("auto": the studio's defaults) and submits it like any job, so
it is queued, watched, listed and chatted with like the page's; a job the page started is listed here too.
The training file (and the validation file) are checked again and written as the studio's rows
(`data/uploads/converted/<format>/<name>`, api/fine_tune_data.py) for the worker to read. Pause is a stop
with a save, resume a new studio job from its checkpoint, cancel a cancel; they act on the newest studio job
of the chain.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, BinaryIO

from fastapi import APIRouter, Query

from tunestudio.api import fine_tune_data, upload_store
from tunestudio.api.deps import ManagerDep, SettingsDep
from tunestudio.api.errors import ApiError
from tunestudio.api.fine_tuning import (
    PARAMS,
    SUFFIX,
    Chain,
    FineTuningRoute,
    chain_of,
    chains,
    config_fields,
    converted_path,
    job_config,
    job_object,
    status_of,
    upload_path,
)
from tunestudio.api.fine_tuning_history import CheckpointList, EventList, checkpoints_page, events_page
from tunestudio.api.fine_tuning_schemas import CreateJob, FineTuningJob, JobList
from tunestudio.api.schemas import OPENAI_ERRORS
from tunestudio.api.security import confine_paths
from tunestudio.jobs import JobManager, JobStatus
from tunestudio.settings import Settings

router = APIRouter(prefix="/v1/fine_tuning/jobs", tags=["OpenAI-compatible fine-tuning"],
                   route_class=FineTuningRoute, responses=OPENAI_ERRORS)


def _studio_rows(settings: Settings, file_id: str, body: CreateJob, param: str) -> tuple[Path, int]:
    """The studio's copy of an uploaded file (made now, unless one newer than the upload exists) and its rows: the
    rows the request's method trains from, in its format (MethodSpec.openai_file)."""
    _, file = body.trains
    try:
        source = upload_path(settings, file_id, param)
    except ApiError as exc:
        raise ApiError(400, "invalid_request", f"{param} {file_id!r}: no such file (GET /v1/files lists them)",
                       field=param) from exc
    target = converted_path(settings, source, file.format)
    if target.is_file() and target.stat().st_mtime >= source.stat().st_mtime:
        with target.open("rb") as handle:
            return target, sum(1 for line in handle if line.strip())
    target.parent.mkdir(parents=True, exist_ok=True)
    count = 0

    def write(out: BinaryIO) -> None:
        nonlocal count
        with source.open("rb") as handle:
            count = fine_tune_data.convert(handle, out, file.rows)

    uploads = settings.uploads_dir()
    try:
        with upload_store.reserved(uploads, source.stat().st_size, settings.max_uploads_total_bytes):
            upload_store.write_file(target.parent, target.name, file_id, write, place=lambda folder, name: target)
    except fine_tune_data.BadFile as exc:
        raise ApiError(400, "invalid_file_format", f"{param} {file_id!r} cannot train method {body.kind}: {exc}",
                       field=param) from None
    return target, count


@router.post("", response_model=FineTuningJob)
def create_job(body: CreateJob, settings: SettingsDep, manager: ManagerDep) -> FineTuningJob:
    """Queue a fine-tuning job of `model` (a local model folder under the model roots, or a hub id)."""
    if body.integrations:
        raise ApiError(400, "invalid_request", "integrations are not supported by tunestudio (its page and "
                       "`enable_wandb` in /api/jobs watch jobs)", field="integrations")
    if body.model.startswith("ft:"):
        raise ApiError(400, "invalid_request", "fine-tuning a fine-tuned model is not supported yet; export it "
                       "merged (POST /api/jobs/{id}/export) and fine-tune the merged folder", field="model")
    if body.suffix is not None and not SUFFIX.match(body.suffix):
        raise ApiError(400, "invalid_request", f"suffix {body.suffix!r}: up to 64 letters, digits, '.', '_' or '-'",
                       field="suffix")
    training, rows = _studio_rows(settings, body.training_file, body, "training_file")
    validation = (_studio_rows(settings, body.validation_file, body, "validation_file")[0]
                  if body.validation_file else None)
    config = job_config(config_fields(body, training, validation, rows))
    try:
        confine_paths(config, settings)
    except ApiError as exc:  # named as the request names it
        raise ApiError(400, exc.code, exc.message, field=PARAMS.get(exc.extra.get("field"), "model")) from None
    warnings = ["metadata is not kept by tunestudio; it was ignored"] if body.metadata else []
    job = manager.submit(config, warnings=warnings)
    if body.suffix:
        job = manager.rename(job.id, body.suffix, None)
    return job_object(manager, Chain([job]), settings)


@router.get("", response_model=JobList)
def list_jobs(settings: SettingsDep, manager: ManagerDep, after: str | None = None,
              limit: Annotated[int, Query(ge=1, le=100)] = 20) -> JobList:
    """Fine-tuning jobs, newest first: every train job of the studio that was not resumed from another."""
    found, more = chains(manager, after, limit)
    if after is not None and not found and not more:
        chain_of(manager, after)  # a 404 for a cursor that names no job
    return JobList(data=[job_object(manager, c, settings) for c in found], has_more=more)


@router.get("/{fine_tuning_job_id}", response_model=FineTuningJob)
def retrieve_job(fine_tuning_job_id: str, settings: SettingsDep, manager: ManagerDep) -> FineTuningJob:
    return job_object(manager, chain_of(manager, fine_tuning_job_id), settings)


def _again(manager: JobManager, chain: Chain, settings: Settings) -> FineTuningJob:
    return job_object(manager, chain_of(manager, chain.id), settings)


@router.post("/{fine_tuning_job_id}/cancel", response_model=FineTuningJob)
def cancel_job(fine_tuning_job_id: str, settings: SettingsDep, manager: ManagerDep) -> FineTuningJob:
    """Cancel a queued or running job (a paused one runs nothing, and keeps its checkpoint)."""
    chain = chain_of(manager, fine_tuning_job_id)
    if chain.last.status.is_terminal:
        raise ApiError(400, "invalid_state", f"fine-tuning job {chain.id} is {status_of(chain)}; only a queued or "
                       "running job can be cancelled", field="fine_tuning_job_id")
    manager.cancel(chain.last.id)
    return _again(manager, chain, settings)


@router.post("/{fine_tuning_job_id}/pause", response_model=FineTuningJob)
def pause_job(fine_tuning_job_id: str, settings: SettingsDep, manager: ManagerDep) -> FineTuningJob:
    """Stop a training job at its next step, saving a checkpoint; it reads `paused` once saved."""
    chain = chain_of(manager, fine_tuning_job_id)
    status = chain.last.status
    if status is JobStatus.stopping:
        return job_object(manager, chain, settings)
    if status is not JobStatus.training:
        raise ApiError(400, "invalid_state", f"fine-tuning job {chain.id} is {status_of(chain)} ({status.value}); "
                       "only a job that is training can be paused", field="fine_tuning_job_id")
    manager.stop(chain.last.id, save=True)
    return _again(manager, chain, settings)


@router.post("/{fine_tuning_job_id}/resume", response_model=FineTuningJob)
def resume_job(fine_tuning_job_id: str, settings: SettingsDep, manager: ManagerDep) -> FineTuningJob:
    """Continue a paused job from its checkpoint (queued again)."""
    chain = chain_of(manager, fine_tuning_job_id)
    if status_of(chain) != "paused":
        raise ApiError(400, "invalid_state", f"fine-tuning job {chain.id} is {status_of(chain)}; only a paused "
                       "job can be resumed", field="fine_tuning_job_id")
    job = manager.resume(chain.last.id)
    if chain.last.name:  # the suffix goes with the model the chain ends in
        manager.rename(job.id, chain.last.name, None)
    return _again(manager, chain, settings)


@router.get("/{fine_tuning_job_id}/events", response_model=EventList)
def list_events(fine_tuning_job_id: str, manager: ManagerDep, after: str | None = None,
                limit: Annotated[int, Query(ge=1, le=1000)] = 20) -> EventList:
    """The job's events, newest first: status changes, logs, warnings and each logged step's metrics."""
    return events_page(manager, chain_of(manager, fine_tuning_job_id), after, limit)


@router.get("/{fine_tuning_job_id}/checkpoints", response_model=CheckpointList)
def list_checkpoints(fine_tuning_job_id: str, manager: ManagerDep, after: str | None = None,
                     limit: Annotated[int, Query(ge=1, le=100)] = 10) -> CheckpointList:
    """The job's complete checkpoints (one an epoch, and each pause), newest first."""
    return checkpoints_page(manager, chain_of(manager, fine_tuning_job_id), after, limit)
