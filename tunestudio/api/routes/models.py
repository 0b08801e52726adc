"""/api/models: the model picker (local folders, recent jobs' models, the hub cache) and the estimate before Start.

Everything is read from files (config.json, safetensors headers): the parent never imports torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tunestudio import paths
from tunestudio.api import modelinfo
from tunestudio.api.deps import ManagerDep, SettingsDep
from tunestudio.api.errors import ApiError
from tunestudio.api.estimate import EstimateUnavailable, Measured, estimate, measured_from
from tunestudio.api.estimate_time import MEASURED_JOBS
from tunestudio.api.hardware import hardware
from tunestudio.api.schemas import ERRORS
from tunestudio.config import format_validation_error, summary
from tunestudio.config.job import (
    AdapterPart,
    DataPart,
    MethodPart,
    ModelPart,
    OptimisationPart,
    OutputPart,
    SeedMediaPart,
)
from tunestudio.jobs import JobStatus
from tunestudio.paths import expand
from tunestudio.settings import Settings

router = APIRouter(prefix="/api/models", tags=["models"], responses=ERRORS)

# The JobConfig fields the estimate reads; their defaults are JobConfig's own.
ESTIMATE_FIELDS = ("training_type", "batch_size", "max_seq_length", "gradient_accumulation_steps", "lora_r",
                   "target_modules", "finetune_attention_modules", "finetune_mlp_modules", "gradient_checkpointing",
                   "precision", "optim", "method", "max_steps", "num_epochs", "eval_steps", "eval_generate_rows",
                   "sample_prompts", "is_dataset_image", "finetune_vision_layers", "finetune_language_layers",
                   "max_image_size", "image_splitting")


class EstimateParts(MethodPart, OutputPart, SeedMediaPart, AdapterPart, OptimisationPart, DataPart, ModelPart):
    """The JobConfig parts an estimate reads, checked as a job's are: no dataset is needed to estimate."""


class DatasetFacts(BaseModel):
    """What the page knows of the dataset's rows (the dataset report's figures)."""

    model_config = ConfigDict(extra="forbid")

    rows: int | None = Field(default=None, ge=0, le=10**9, description="Usable rows.")
    tokens_per_row: float | None = Field(default=None, ge=0, le=10**7, description="Their mean tokens.")
    eval_rows: int | None = Field(default=None, ge=0, le=10**9, description="Rows of the eval split or held out.")
    held_out: int | None = Field(default=None, ge=0, le=10**9, description="Of `rows`, those held out.")


class LocalModel(BaseModel):
    path: str
    name: str
    bytes: int
    architecture: str | None
    model_type: str | None
    parameters: int | None
    error: str | None = Field(default=None, description="Why the weights could not be read (parameters: null).")


class ModelList(BaseModel):
    local: list[LocalModel]
    recent: list[str] = Field(description="Models of the most recent jobs, newest first.")
    cached: list[str] = Field(description="Hub ids with a snapshot in the local hub cache.")
    roots: list[str]


class HubModel(BaseModel):
    id: str
    cached: bool
    path: str | None
    architecture: str | None = None
    parameters: int | None = None
    error: str | None = Field(default=None, description="Why the weights could not be read (parameters: null).")


class EstimateRequest(BaseModel):
    """The form's config as it stands; fields the estimate does not read are ignored."""

    model_config = ConfigDict(extra="allow")

    model_name: str = Field(min_length=1)
    dataset: DatasetFacts | None = None
    as_of: float | None = Field(default=None, ge=0, description="Count only jobs that finished before this time (a "
                                "job's page: the estimate as it was when the job was created).")


@router.get("", response_model=ModelList)
def list_models(settings: SettingsDep, manager: ManagerDep) -> ModelList:
    """Model folders (config.json and weights) under the model roots, recent jobs' models, cached hub ids."""
    roots = settings.allowed_model_roots()
    local = [LocalModel(**modelinfo.describe(folder)) for folder in modelinfo.local_models(roots)]
    recent: list[str] = []
    for job in manager.list(limit=50):
        name = job.config.model_name if job.spec.trains else None
        if name and name not in recent:
            recent.append(name)
    return ModelList(local=local, recent=recent[:10], cached=modelinfo.cached_hub_models(),
                     roots=[str(r) for r in roots])


@router.get("/hub", response_model=HubModel)
def hub_model(id: Annotated[str, Query(min_length=1, max_length=200, pattern=r"^[\w.-]+(/[\w.-]+)?$")]) -> HubModel:
    """Whether a hub model id is in the local hub cache (a job can then start without the network)."""
    folder = modelinfo.cached_snapshot(id)
    if folder is None:
        return HubModel(id=id, cached=False, path=None)
    info = modelinfo.describe(folder)
    return HubModel(id=id, cached=True, path=str(folder), architecture=info["architecture"],
                    parameters=info["parameters"], error=info["error"])


def _model_folder(name: str, settings: Settings) -> Path:
    """The folder whose config.json describes the model: a local folder inside the model roots, or the hub cache."""
    try:
        return _find_model_folder(name, settings)
    except (OSError, ValueError) as exc:  # a name no filesystem takes: too long, a NUL byte
        raise ApiError(422, "invalid_request", f"model_name: not a usable folder name or hub id ({type(exc).__name__})",
                       field="model_name") from None


def _find_model_folder(name: str, settings: Settings) -> Path:
    if paths.looks_like_path(name) or expand(name).is_dir():
        folder = expand(name).resolve()
        if not any(folder.is_relative_to(root) for root in settings.allowed_model_roots()):
            raise ApiError(422, "path_not_allowed", f"model_name: {name!r} is outside the model folders "
                           "(TUNESTUDIO_MODEL_ROOTS)", field="model_name")
        if not (folder / "config.json").is_file():
            raise ApiError(422, "unavailable", f"model_name: no config.json in {name!r}", field="model_name")
        return folder
    folder = modelinfo.cached_snapshot(name)
    if folder is None:
        raise ApiError(422, "unavailable", f"model_name: {name!r} is not in the local hub cache; the estimate "
                       "needs its config.json", field="model_name")
    return folder


def _calibrations(settings: Settings) -> dict[str, Any]:
    """The worker's measured precision decisions (worker/train/calibrate.py's cache), {} when none can be read."""
    try:
        data = json.loads((settings.cache_dir() / "precision.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _measured(manager: ManagerDep, settings: Settings, wanted: dict[str, Any], as_of: float | None) -> list[Measured]:
    """Finished training jobs on this data directory, newest first, as the estimate holds its formula against them:
    up to MEASURED_JOBS of the wanted model, training type and method, and as many of others (each one's metrics
    are read, so no more than that)."""
    same: list[Measured] = []
    others: list[Measured] = []
    for job in manager.list([JobStatus.completed, JobStatus.stopped], limit=200):
        if len(same) >= MEASURED_JOBS and len(others) >= MEASURED_JOBS:
            break
        if job.kind != "train" or job.resumed_from or not job.finished_at or not job.started_at:
            continue
        if as_of is not None and job.finished_at >= as_of:
            continue
        trained = job.train_config
        kind = same if (trained.model_name, trained.training_type.value, trained.method) == (
            wanted["model_name"], wanted["training_type"], wanted["method"]) else others
        if len(kind) >= MEASURED_JOBS:
            continue
        try:
            config = modelinfo.read_shape(_find_model_folder(trained.model_name, settings)) or None
        except (ApiError, OSError, ValueError):
            config = None
        result = job.result or {}
        held_out = (result.get("held_out") or {}).get("rows") or (result.get("evaluation") or {}).get("scored_rows")
        found = measured_from(job.id, trained.model_name, _estimate_fields(trained), config, manager.metrics(job.id),
                              job.finished_at - job.started_at if job.status is JobStatus.completed else None,
                              held_out if isinstance(held_out, int) and held_out > 0 else None)
        if found is not None:
            kind.append(found)
    return same + others


def _estimate_fields(checked: BaseModel) -> dict[str, Any]:
    """The fields the estimate reads, from a validated JobConfig or its parts."""
    job = {name: getattr(checked, name) for name in ESTIMATE_FIELDS}
    job["training_type"] = job["training_type"].value
    job["model_name"] = checked.model_name  # type: ignore[attr-defined]
    return job


@router.post("/estimate")
def estimate_job(body: EstimateRequest, settings: SettingsDep, manager: ManagerDep) -> dict[str, Any]:
    """Parameters, trainable parameters, memory (model, adapter, gradients, optimizer, activations), whether it fits
    this machine, the time a step and the time to finish (training, evaluations, answers, loading and saving) with
    what each rests on (`basis`). Refuses nothing: it says when a job will not fit."""
    folder = _model_folder(body.model_name, settings)
    fields = {k: v for k, v in (body.model_extra or {}).items() if k in ESTIMATE_FIELDS and v is not None}
    try:
        checked = EstimateParts.model_validate({"model_name": body.model_name, **fields})
    except ValidationError as exc:  # the form's numbers, checked as JobConfig checks them: a 422 naming the field
        errors = format_validation_error(exc)
        raise ApiError(422, "invalid_request", summary(errors), errors=errors) from None
    job = _estimate_fields(checked)
    config = modelinfo.read_shape(folder) or {}
    try:
        parameters = modelinfo.safetensors_parameters(folder)
    except modelinfo.BadWeights as exc:
        raise ApiError(422, "unavailable", f"model_name: {exc}; the estimate cannot count its parameters, and a "
                       "job could not load it", field="model_name") from None
    try:
        result = estimate(config, job, hardware(), parameters, _calibrations(settings),
                          _measured(manager, settings, job, body.as_of),
                          body.dataset.model_dump() if body.dataset else None)
    except EstimateUnavailable as exc:
        raise ApiError(422, "unavailable", f"model_name: {exc}", field="model_name") from None
    return {"model": str(folder), **result.as_dict()}
