"""OpenAI's fine-tuning API as a view over the studio's uploads and train jobs (routes/files.py and
routes/fine_tuning.py answer with what this module makes; the request and response bodies are
api/fine_tuning_schemas.py's).

Ids, derived, so nothing is kept beside the store and the uploads folder:
- a file is `file-<name>`, `<name>` the upload's name in `data/uploads/` (unique: an upload never replaces
  another); the copy a job trains on (OpenAI's rows in the studio's format) is `data/uploads/converted/
  <format>/<name>`, and maps back to the same id. A job's metrics CSV is `file-results-<job id>`.
- a fine-tuning job is `ftjob-<studio job id>`: the first job of its resume chain. A pause is a stop with a
  save; a resume makes a new studio job (`resumed_from`); the OpenAI job follows the chain to its newest
  studio job for its status, result, events and checkpoints. Any studio job id of the chain names it.
- the result is the model `ft:<base>:<suffix>:<studio job id>` (inference/models.py), the suffix kept as the
  studio job's name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import Request, Response
from pydantic import ValidationError

from tunestudio.api.errors import ApiError
from tunestudio.api.fine_tuning_schemas import (
    CreateJob,
    FineTuningJob,
    Hyperparameters,
    JobError,
    MethodOut,
    MethodSettings,
    OpenAIStatus,
)
from tunestudio.api.openai_route import OpenAIRoute, error_response
from tunestudio.api.upload_store import CONVERTED, stored
from tunestudio.config import (
    OPENAI_TYPES,
    JobConfig,
    format_validation_error,
    method_spec,
    openai_method,
)
from tunestudio.inference import SUFFIX, fine_tuned_name
from tunestudio.jobs import Job, JobConflict, JobManager, JobNotFound, JobStatus, QueueFull, StoreUnavailable
from tunestudio.paths import PathRefused
from tunestudio.settings import Settings

S = JobStatus
FILE_PREFIX = "file-"
RESULTS_PREFIX = "file-results-"
JOB_PREFIX = "ftjob-"
DEFAULTS = JobConfig.model_fields
DEFAULT_LEARNING_RATE: float = DEFAULTS["learning_rate"].default
DEFAULT_BATCH: int = DEFAULTS["batch_size"].default
DEFAULT_ACCUMULATION: int = DEFAULTS["gradient_accumulation_steps"].default
# With a validation file, the validation loss is measured this often (a fraction of the total steps).
EVAL_EVERY = 0.25
# The studio's names of what OpenAI's request sets, for errors that name a config field.
PARAMS = {"model_name": "model", "num_epochs": "n_epochs", "batch_size": "batch_size",
          "gradient_accumulation_steps": "batch_size", "learning_rate": "learning_rate_multiplier",
          "beta": "beta", "random_seed": "seed", "local_datasets": "training_file", "eval_split": "validation_file"}


# --- errors in OpenAI's shape ------------------------------------------------------------------
class FineTuningRoute(OpenAIRoute):
    """/v1/files and /v1/fine_tuning: the manager's refusals in OpenAI's shape too (a 422 is OpenAI's 400)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                response = await handler(request)
            except JobNotFound as exc:
                return error_response(404, str(exc), "not_found", "fine_tuning_job_id")
            except JobConflict as exc:
                return error_response(400, str(exc), "invalid_state")
            except PathRefused as exc:
                return error_response(400, str(exc), exc.code, PARAMS.get(exc.field, exc.field))
            except QueueFull as exc:
                return error_response(429, str(exc), "queue_full")
            except StoreUnavailable as exc:
                return error_response(503, str(exc), "store_unavailable")
            if response.status_code == 422:  # an ApiError of shared code (uploads): OpenAI says 400
                response.status_code = 400
            return response

        return handle


def not_found(what: str, given: str, param: str) -> ApiError:
    return ApiError(404, "not_found", f"no {what} {given!r}", field=param)


# --- files ---------------------------------------------------------------------------------------
def upload_id(path: Path) -> str:
    return FILE_PREFIX + path.name


def upload_path(settings: Settings, file_id: str, param: str = "file_id") -> Path:
    """The upload a file id names; a 404 for anything else (another folder, a results file, no such file)."""
    name = file_id.removeprefix(FILE_PREFIX)
    folder = settings.uploads_dir()
    if (not file_id.startswith(FILE_PREFIX) or file_id.startswith(RESULTS_PREFIX) or Path(name).name != name
            or name.startswith(".") or stored(folder, name) is None):
        raise not_found("file", file_id, param)
    return folder / name


def converted_path(settings: Settings, source: Path, fmt: str) -> Path:
    return settings.uploads_dir() / CONVERTED / fmt / source.name


def dataset_id(settings: Settings, raw: str | None) -> str | None:
    """The file id of a dataset a job reads (an upload, or a converted copy of one); else the path as written."""
    if not raw:
        return None
    path, uploads = Path(raw), settings.uploads_dir()
    if path.parent == uploads or path.parent.parent == uploads / CONVERTED:
        return upload_id(path)  # (an upload deleted since: its id, which answers 404 now)
    return raw


# --- a resume chain: one OpenAI job -----------------------------------------------------------------
@dataclass(frozen=True)
class Chain:
    """The studio jobs of one OpenAI job, oldest first: the job created, then each job resumed from the one before."""

    jobs: list[Job]

    @property
    def root(self) -> Job:
        return self.jobs[0]

    @property
    def last(self) -> Job:
        return self.jobs[-1]

    @property
    def id(self) -> str:
        return JOB_PREFIX + self.root.id


def chain_from(manager: JobManager, root: Job) -> Chain:
    jobs, seen = [root], {root.id}
    while (nxt := jobs[-1].resumed_by) is not None and nxt not in seen:
        try:
            jobs.append(manager.get(nxt))
        except JobNotFound:
            break
        seen.add(nxt)
    return Chain(jobs)


def chain_of(manager: JobManager, openai_id: str) -> Chain:
    """The chain `ftjob-<id>` names (any of its studio jobs); JobNotFound for anything else."""
    studio_id = openai_id.removeprefix(JOB_PREFIX)
    if not openai_id.startswith(JOB_PREFIX) or not studio_id:
        raise JobNotFound(openai_id)
    try:
        job = manager.get(studio_id)
    except JobNotFound:
        raise JobNotFound(openai_id) from None
    if not job.spec.trains:
        raise JobNotFound(openai_id)
    seen = {job.id}
    while job.resumed_from is not None and job.resumed_from not in seen:
        try:
            job = manager.get(job.resumed_from)
        except JobNotFound:
            break
        seen.add(job.id)
    return chain_from(manager, job)


def chains(manager: JobManager, after: str | None, limit: int) -> tuple[list[Chain], bool]:
    """Up to `limit` OpenAI jobs, newest first, after the one named `after`; and whether more follow."""
    found: list[Chain] = []
    passed = after is None
    offset, page = 0, 200
    while True:
        jobs = manager.list(limit=page, offset=offset)
        for job in jobs:
            if not job.spec.trains or job.resumed_from is not None:
                continue
            if not passed:
                passed = JOB_PREFIX + job.id == after
                continue
            if len(found) == limit:
                return found, True
            found.append(chain_from(manager, job))
        if len(jobs) < page:
            return found, False
        offset += page


# --- the status ---------------------------------------------------------------------------------------
STATUSES: dict[JobStatus, OpenAIStatus] = {
    S.queued: "queued",
    # the worker loads the model and reads (checks) the rows before the first step
    S.starting: "validating_files", S.loading_model: "validating_files", S.loading_dataset: "validating_files",
    S.training: "running", S.saving: "running", S.stopping: "running",  # a pause ends at "paused"
    S.completed: "succeeded",
    S.cancelling: "cancelled", S.cancelled: "cancelled",
    S.failed: "failed",
    S.stopped: "paused", S.interrupted: "paused",  # both resume from their checkpoint (else failed)
}


def status_of(chain: Chain) -> OpenAIStatus:
    job = chain.last
    status = STATUSES[job.status]
    if status == "paused" and not job.resumable:
        return "failed"
    return status


# --- the config -------------------------------------------------------------------------------------------
def _given(value: Any) -> Any:
    return None if value in (None, "auto") else value


def config_fields(body: CreateJob, training: Path, validation: Path | None, rows: int) -> dict[str, Any]:
    """The JobConfig fields of an OpenAI request: "auto" is the studio's default.

    batch_size N is examples per optimizer step: per step batch_size x gradient_accumulation_steps, the
    per-device batch the largest divisor of N up to the studio's default (2). learning_rate_multiplier scales
    the studio's default learning rate (2e-4, a LoRA rate). One checkpoint per epoch (save_steps).
    """
    hyper, (spec, file) = body.hyper(), body.trains
    if "beta" not in spec.options and _given(hyper.beta) is not None:
        with_beta = [t for t in OPENAI_TYPES if "beta" in openai_method(t)[0].options]
        raise ApiError(400, "invalid_request", f"beta is a hyperparameter of method {' or '.join(with_beta)}",
                       field="beta")
    fields: dict[str, Any] = {
        "model_name": body.model, "local_datasets": [str(training)], "method": spec.name, "format_type": file.format,
        "eval_generate_rows": 0,
    }
    if (epochs := _given(hyper.n_epochs)) is not None:
        fields["num_epochs"] = epochs
    batch = _given(hyper.batch_size)
    per_device = math.gcd(batch, DEFAULT_BATCH) if batch is not None else DEFAULT_BATCH
    accumulation = batch // per_device if batch is not None else DEFAULT_ACCUMULATION
    fields |= {"batch_size": per_device, "gradient_accumulation_steps": accumulation}
    if (multiplier := _given(hyper.learning_rate_multiplier)) is not None:
        fields["learning_rate"] = DEFAULT_LEARNING_RATE * multiplier
    if (beta := _given(hyper.beta)) is not None:
        fields["beta"] = beta
    if body.seed is not None:
        fields["random_seed"] = body.seed
    if validation is not None:
        fields |= {"eval_split": str(validation), "eval_steps": EVAL_EVERY}
    fields["save_steps"] = max(1, math.ceil(rows / (per_device * accumulation)))
    return fields


def job_config(fields: dict[str, Any]) -> JobConfig:
    """The validated config; a 400 naming OpenAI's parameter for a value the studio refuses."""
    try:
        return JobConfig.model_validate(fields)
    except ValidationError as exc:
        errors = format_validation_error(exc)
        first = errors[0]["field"].split(".")[0] if errors else ""
        summary = "; ".join(f"{PARAMS.get(e['field'].split('.')[0], e['field'])}: {e['message']}" for e in errors)
        raise ApiError(400, "invalid_request", summary, field=PARAMS.get(first, first or None)) from None


# --- the job object ------------------------------------------------------------------------------------------
def hyperparameters(config: JobConfig) -> Hyperparameters:
    """What the studio trains with, in OpenAI's terms (see config_fields)."""
    epochs = float(config.num_epochs)
    batch = config.batch_size * config.gradient_accumulation_steps * config.num_processes
    multiplier = config.learning_rate / DEFAULT_LEARNING_RATE
    beta = config.beta if method_spec(config.method).openai_kind == "dpo" else None  # OpenAI's dpo settings
    return Hyperparameters(n_epochs=int(epochs) if epochs.is_integer() else epochs, batch_size=batch,
                           learning_rate_multiplier=float(f"{multiplier:.6g}"), beta=beta)


def method_of(config: JobConfig, hyper: Hyperparameters) -> MethodOut:
    kind = method_spec(config.method).openai_kind
    settings = MethodSettings(hyperparameters=hyper)
    return MethodOut(type=kind, supervised=settings if kind == "supervised" else None,
                     dpo=settings if kind == "dpo" else None)


def suffix_of(job: Job) -> str | None:
    return job.name if job.name and SUFFIX.match(job.name) else None


def error_of(chain: Chain, status: OpenAIStatus) -> JobError | None:
    job = chain.last
    if status != "failed":
        return None
    if job.status is S.interrupted:
        return JobError(code="interrupted", message=job.message or "the server stopped while the job ran, and "
                        "it has no checkpoint to resume from")
    return JobError(code="job_failed", message=job.error or job.message or "the job failed")


def trained_tokens(manager: JobManager, chain: Chain) -> int | None:
    """Tokens trained on, the trainer's count (it carries on through a resume): the newest record that says
    (an eval record, often the last, does not)."""
    for job in reversed(chain.jobs):
        step = int((job.progress or {}).get("step") or 0)
        for record in reversed(manager.metrics(job.id, since_step=max(0, step - 2)) if step else []):
            if record.get("num_tokens") is not None:
                return int(record["num_tokens"])
    return None


def estimated_finish(job: Job) -> int | None:
    eta = (job.progress or {}).get("eta_seconds")
    return int(job.progress["ts"] + eta) if eta is not None and "ts" in (job.progress or {}) else None


def job_object(manager: JobManager, chain: Chain, settings: Settings) -> FineTuningJob:
    root, last = chain.root, chain.last
    config = root.train_config
    status = status_of(chain)
    hyper = hyperparameters(config)
    datasets = config.local_datasets
    return FineTuningJob(
        id=chain.id,
        created_at=int(root.created_at),
        finished_at=int(last.finished_at) if status in ("succeeded", "failed", "cancelled") and last.finished_at
        else None,
        model=config.model_name,
        fine_tuned_model=fine_tuned_name(last) if status == "succeeded" else None,
        status=status,
        error=error_of(chain, status),
        hyperparameters=hyper,
        method=method_of(config, hyper),
        training_file=dataset_id(settings, datasets[0] if datasets else None) or (config.hf_dataset or ""),
        validation_file=dataset_id(settings, config.eval_split) if _is_path(config.eval_split) else None,
        result_files=[RESULTS_PREFIX + root.id] if status == "succeeded" else [],
        trained_tokens=trained_tokens(manager, chain),
        seed=config.random_seed,
        user_provided_suffix=suffix_of(root),
        estimated_finish=estimated_finish(last) if status == "running" else None,
    )


def _is_path(raw: Any) -> bool:
    return isinstance(raw, str) and ("/" in raw or Path(raw).suffix != "")


