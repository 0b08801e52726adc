"""Job files: a job's settings, or the form's, as the YAML `tunestudio train` reads and a shell command; and a
pasted job file read back into the form's fields.

- `GET /api/jobs/{id}/jobfile`: a train job's config as it ran, less what the job chose for itself
  (`api.jobfile.JOB_OWN`: its output folder, its resume point, a sweep's MLflow run).
- `POST /api/jobfile?name=` (a config, as `POST /api/jobs` takes it, and the job's name): checked as a submit
  checks it (the fields, then the paths: inside the allowed roots, made absolute, those that must exist existing),
  so the file runs from any folder.
- `POST /api/jobfile/parse` ({text}): the job file validated as the CLI validates it; the config's every field
  (no secrets) and the job's name, or a 422 whose `errors` name each bad field.

A job file's `name` is the job's (the job list shows it), not a field of its config: `tunestudio train` names
the job with it, and the form's paste fills the form's name.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field, ValidationError

from tunestudio import paths
from tunestudio.api.deps import ManagerDep, SettingsDep
from tunestudio.api.errors import ApiError
from tunestudio.api.jobfile import JOB_OWN, JobFile, job_file
from tunestudio.api.schemas import ERRORS
from tunestudio.api.security import confine_paths
from tunestudio.config import SECRET_FIELDS, ConfigError, JobConfig, format_validation_error, summary
from tunestudio.config.files import NAME_MAX, parse_config_text

router = APIRouter(prefix="/api", tags=["job files"], responses=ERRORS)
MAX_TEXT = 1_000_000


class JobFileText(BaseModel):
    text: str = Field(max_length=MAX_TEXT, description="A job file: YAML (or JSON) of JobConfig's fields.")


class ParsedJobFile(BaseModel):
    config: dict[str, Any] = Field(description="Every field of the config the file gives, secrets left out.")
    secrets_left_out: list[str] = Field(description="Secret fields the file set: never sent back; type them in.")
    name: str | None = Field(default=None, description="The job's name, when the file gives one.")


@router.get("/jobs/{job_id}/jobfile", response_model=JobFile)
def job_jobfile(job_id: str, manager: ManagerDep, settings: SettingsDep) -> JobFile:
    """The job's settings as a job file and a shell command (train jobs: exports and benchmarks have none)."""
    job = manager.get(job_id)
    if not job.spec.trains:
        what = "an export" if job.kind == "export" else f"a {job.kind} job"
        raise ApiError(409, "not_a_train_job", f"job {job_id} is {what}; only a train job has a job file")
    header = (f"job {job.id}: its settings, for `tunestudio train`.\n"
              "Left out: its output folder (a run makes a new one), its resume point and any secret.")
    return job_file(job.train_config, f"job-{job.id}.yaml", settings.data_dir(), header, JOB_OWN, name=job.name)


@router.post("/jobfile", response_model=JobFile)
def form_jobfile(config: JobConfig, settings: SettingsDep,
                 name: Annotated[str | None, Query(max_length=NAME_MAX, description="The job's name.")] = None,
                 ) -> JobFile:
    """The config as a job file and a shell command, its paths checked and made absolute as a submit makes them."""
    confine_paths(config, settings)
    try:
        resolved = paths.resolve(config)
    except paths.PathRefused as exc:
        raise ApiError(422, exc.code, str(exc), field=exc.field,
                       errors=[{"field": exc.field, "message": exc.message}]) from None
    return job_file(resolved, "job.yaml", settings.data_dir(), "A job file for `tunestudio train`.",
                    name=(name or "").strip() or None)


@router.post("/jobfile/parse", response_model=ParsedJobFile)
def parse_jobfile(body: JobFileText) -> ParsedJobFile:
    """Read a job file as `tunestudio train` reads it: its config's fields, or a 422 naming each bad field."""
    try:
        cfg, name = parse_config_text(body.text)
    except ConfigError as exc:
        raise ApiError(422, "invalid_job_file", str(exc), errors=[{"field": "", "message": str(exc)}]) from None
    except ValidationError as exc:
        errors = format_validation_error(exc)
        raise ApiError(422, "invalid_job_file", summary(errors, unnamed="job file"), errors=errors) from None
    return ParsedJobFile(config=cfg.public_dict(), name=name,
                         secrets_left_out=[field for field in SECRET_FIELDS if getattr(cfg, field) is not None])
