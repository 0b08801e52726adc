"""/api/jobs/{id}/benchmarks: lm-evaluation-harness on a finished job and its base model, through this server.

POST queues a benchmark (a job of kind "bench", source_job the job; see bench_config.py and worker/bench.py)
whose worker calls this very server's /v1/completions; GET lists the job's benchmarks, newest first, each with
its figures once it has them: per task and metric, before (the base model), after (the job), the difference
and its standard error, with the harness's version and each task's version.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Request
from pydantic import BaseModel, Field

from tunestudio.api.benchmarks import bench_config, confine_eval_file
from tunestudio.api.deps import ManagerDep, SettingsDep
from tunestudio.api.errors import ApiError
from tunestudio.api.schemas import ERRORS, JobOut
from tunestudio.bench_config import BenchConfig, BenchOptions
from tunestudio.inference import UnknownModel
from tunestudio.jobs import JobStatus

router = APIRouter(prefix="/api/jobs", tags=["benchmarks"], responses=ERRORS)
MAX_LISTED = 200


class BenchmarkOut(BaseModel):
    id: str = Field(description="The benchmark's own job id (its log, events and stop are a job's).")
    status: JobStatus
    is_terminal: bool
    phase: str | None = None
    message: str = ""
    error: str | None = None
    created_at: float
    finished_at: float | None = None
    tasks: list[str]
    eval_file: str | None = None
    limit: int | None = None
    models: dict[str, str]
    result: dict[str, Any] | None = Field(default=None, description=(
        "{harness, models, limit, chat_template, tasks: {task: {version, samples, metrics: {metric: {before, after, "
        "difference, stderr, stderr_before, stderr_after}}}}}"))


class BenchmarksOut(BaseModel):
    job_id: str
    benchmarks: list[BenchmarkOut]


def server_url(request: Request) -> str:
    """This server's own address, as a worker on this machine reaches it (a wildcard bind: loopback)."""
    host, port = request.scope.get("server") or ("127.0.0.1", 8000)
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@router.post("/{job_id}/benchmarks", status_code=201, response_model=JobOut)
def create_benchmark(
    job_id: str,
    options: BenchOptions,
    request: Request,
    manager: ManagerDep,
    settings: SettingsDep,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> JobOut:
    """Queue a benchmark of a finished job and its base model (tasks: lm-evaluation-harness names whose data is
    in the local HF datasets cache; eval_file: your own multiple-choice or exact-match rows). The answer is the
    benchmark's job (kind "bench"), watched like any job."""
    manager.get(job_id)  # 404 first
    confine_eval_file(options, settings.roots())
    token = settings.api_token.get_secret_value() if settings.api_token is not None else None
    try:
        config = bench_config(manager, job_id, options, server_url(request), token)
    except UnknownModel as exc:
        raise ApiError(409 if exc.status == 404 else exc.status, "conflict", str(exc), field="job_id") from None
    return JobOut.of(manager.benchmark(config, request_id=idempotency_key))


@router.get("/{job_id}/benchmarks", response_model=BenchmarksOut)
def list_benchmarks(job_id: str, manager: ManagerDep) -> BenchmarksOut:
    """The job's benchmarks, newest first, with their figures once finished."""
    manager.get(job_id)
    found = [j for j in manager.list(limit=MAX_LISTED) if j.kind == "bench" and j.source_job == job_id]
    return BenchmarksOut(job_id=job_id, benchmarks=[
        BenchmarkOut(id=j.id, status=j.status, is_terminal=j.is_terminal, phase=j.phase, message=j.message,
                     error=j.error, created_at=j.created_at, finished_at=j.finished_at, tasks=c.tasks,
                     eval_file=c.eval_file, limit=c.limit, models=c.models, result=(j.result or {}).get("benchmarks"))
        for j in found if isinstance(c := j.config, BenchConfig)])
