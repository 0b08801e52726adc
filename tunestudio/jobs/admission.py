"""What a submit checks before a job is recorded, and how an export's config is built (no state of its own).

Every check here runs before anything is written or started, and refuses with the field it is about
(`paths.PathRefused`, a 422 in the API) or the reason the job cannot do it (`JobConflict`, a 409).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from pathlib import Path

from tunestudio import ownership, paths
from tunestudio.bench_config import BenchConfig
from tunestudio.checkpoints import latest_checkpoint
from tunestudio.config import JobConfig
from tunestudio.events import HELD_OUT_FILE
from tunestudio.export_config import ExportConfig, ExportOptions
from tunestudio.jobs.models import CONFIG_TYPES, Job, JobConflict
from tunestudio.jobs.status import RESUMABLE, JobStatus
from tunestudio.paths import expand
from tunestudio.process import gpu_count, usable_cores
from tunestudio.settings import Settings

__all__ = ["check_export", "check_train", "export_config", "new_job_id", "resume_config", "same_request",
           "stored_config"]


def new_job_id() -> str:
    return datetime.now().strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def check_train(config: JobConfig, settings: Settings) -> JobConfig:
    """The config with its paths resolved, once its ranks, inputs and output folder pass."""
    config = paths.resolve(config)
    if "mlflow" in config.report_to and config.mlflow_tracking_uri is None:  # the worker cannot know the default
        config = config.model_copy(update={"mlflow_tracking_uri": settings.mlflow_tracking_uri()})
    _check_processes(config.num_processes, settings)
    paths.protect_inputs(config)
    if config.output_dir:
        _check_takeable(config.output_dir)
    return config


def export_config(source: Job, options: ExportOptions) -> ExportConfig:
    """The ExportConfig of an export of `source` (a finished training job), its checkpoint and output folder
    resolved once; JobConflict when the job has nothing to export."""
    if not source.spec.trains:
        raise JobConflict(f"job {source.id} is an export; export the training job {source.source_job} instead")
    if source.status not in (JobStatus.completed, JobStatus.stopped) or not source.output_dir:
        raise JobConflict(f"job {source.id} is {source.status.value}; only a completed job (or one stopped with "
                          "a save) has a result to export")
    if not Path(source.output_dir).is_dir():
        raise JobConflict(f"job {source.id}'s output folder {source.output_dir} is gone; nothing to export")
    fields = {**options.model_dump(exclude={"hf_token"}), "hf_token": options.hf_token,
              "checkpoint": paths.export_checkpoint(options.checkpoint, source.output_dir)}
    config = ExportConfig(**fields, source_job_id=source.id, source_dir=source.output_dir)
    return config.model_copy(update={"output_dir": str(expand(config.resolved_output_dir()).resolve())})


def check_export(config: ExportConfig, source: Job, data_dir: Path, others: list[tuple[str, bool]]) -> None:
    """An export's output folder: its own (not the source's, its checkpoint or inputs, nor another job's)."""
    assert config.output_dir is not None and source.output_dir is not None
    paths.protect_export_dir(config.output_dir, source.output_dir, data_dir, others)
    paths.protect_export_inputs(config.output_dir, source.train_config, config.checkpoint)
    _check_takeable(config.output_dir)


def resume_config(job: Job, resumed_by: str | None, secrets: dict[str, str], num_processes: int | None) -> JobConfig:
    """The config of a job that continues `job` from its checkpoint (in a new output folder), holding out the
    rows `job` held out (its held_out.json); JobConflict when it cannot resume. num_processes: run the rest on
    this many ranks."""
    if not job.spec.trains:
        raise JobConflict(f"job {job.id} is an export; exports do not resume: export again")
    if job.status not in RESUMABLE:
        raise JobConflict(f"job {job.id} is {job.status.value}; only stopped, interrupted or failed jobs resume")
    if resumed_by is not None:
        raise JobConflict(f"job {job.id} was resumed already, as job {resumed_by}; resume that one")
    checkpoint = job.checkpoint or latest_checkpoint(job.output_dir)
    if checkpoint is None or not Path(checkpoint).is_dir():
        raise JobConflict(f"job {job.id} has no checkpoint to resume from")
    public = {**job.train_config.public_dict(), "resume_from_checkpoint": checkpoint, "output_dir": None}
    held_out = Path(job.output_dir or "") / HELD_OUT_FILE
    if job.output_dir and held_out.is_file():  # the rows it held out, again: the same evaluation, no leak
        public["held_out_rows"] = str(held_out)
    if num_processes is not None:
        public["num_processes"] = num_processes
    return JobConfig.from_parts(public, secrets)


def stored_config(row: dict, secrets: dict[str, str]) -> JobConfig | ExportConfig | BenchConfig:
    """The config of a job another process queued, with its secrets, validated again from its row."""
    config = CONFIG_TYPES[row.get("kind") or "train"].from_parts(row["config"], secrets)
    return paths.resolve(config) if isinstance(config, JobConfig) else config


def same_request(row: dict, request_id: str, kind: str, source_job: str | None) -> Job:
    """The job an idempotency key made before, if it was the same kind of request (of the same source)."""
    job = Job.from_row(row)
    if job.kind != kind or job.source_job != source_job:
        raise JobConflict(f"request id {request_id!r} was used for another request (job {job.id}, a {job.kind} "
                          "job); use a new key for a new request")
    return job


def _check_takeable(output_dir: str) -> None:
    """PathRefused unless the job can take this folder as its own (tunestudio.ownership)."""
    try:
        ownership.check(expand(output_dir))
    except ownership.NotOurs as exc:
        raise paths.PathRefused("output_dir", str(exc), code="output_dir_not_empty") from None
    except OSError as exc:  # a name the filesystem refuses (ENAMETOOLONG): no folder to take, not a server fault
        raise paths.PathRefused("output_dir", f"{output_dir}: the filesystem cannot use this name "
                                              f"({exc.strerror})") from None


def _check_processes(num_processes: int, settings: Settings) -> None:
    """Refuse more ranks than this machine has cores (or GPUs): each rank is a process with its own copy of
    the model. A Ray cluster places ranks itself and is not checked here."""
    if num_processes <= 1 or settings.executor != "local":
        return
    cores, gpus = usable_cores(), gpu_count()
    if num_processes > max(cores, gpus):
        # a config field refused by what the machine has: the same 422 naming the field as a path's refusal
        raise paths.PathRefused("num_processes", f"{num_processes} ranks on a machine with {cores} CPU cores and "
                                f"{gpus or 'no'} GPU{'s' if gpus != 1 else ''}: at most {max(cores, gpus)} here",
                                code="too_many_processes")
