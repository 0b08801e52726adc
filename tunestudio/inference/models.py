"""Which jobs one can chat with, under which model ids, and where their weights are.

A job can answer once it has weights: a completed or stopped job in its
output folder (a stop with save writes the model trained so far there), an
interrupted one in its latest checkpoint. Its id names the result; `<id>:base`
names the base model it was trained from, spoken to with the job's tokenizer
and chat template, so both answer the same prompt text.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tunestudio.checkpoints import latest_checkpoint
from tunestudio.inference.protocol import ModelSpec
from tunestudio.jobs.manager import JobManager
from tunestudio.jobs.models import Job, JobNotFound
from tunestudio.jobs.status import JobStatus

CHAT_STATUSES = [JobStatus.completed, JobStatus.stopped, JobStatus.interrupted]
BASE_SUFFIX = ":base"


class UnknownModel(LookupError):
    """No job answers to this model id; the message says why, for the user."""

    def __init__(self, model_id: str, reason: str) -> None:
        super().__init__(f"model {model_id!r} {reason}")
        self.model_id = model_id


def _has_weights(folder: Path) -> bool:
    return (folder / "adapter_config.json").is_file() or (folder / "config.json").is_file()


def weights_folder(job: Job) -> Path | None:
    """The folder holding the job's adapter or model, or None if it has none (yet, or any more)."""
    if job.status not in CHAT_STATUSES:
        return None
    if job.status in (JobStatus.completed, JobStatus.stopped) and job.output_dir:
        out = Path(job.output_dir)
        if _has_weights(out):
            return out
    checkpoint = job.checkpoint or latest_checkpoint(job.output_dir)
    if checkpoint and _has_weights(Path(checkpoint)):
        return Path(checkpoint)
    return None


def spec_for(job: Job, base: bool) -> ModelSpec | None:
    folder = weights_folder(job)
    if folder is None:
        return None
    has_tokenizer = (folder / "tokenizer_config.json").is_file()
    return ModelSpec(
        job_id=job.id,
        base=base,
        base_model=str(job.config.get("model_name", "")),
        weights=str(folder),
        kind="adapter" if (folder / "adapter_config.json").is_file() else "full",
        tokenizer=str(folder) if has_tokenizer else str(job.config.get("model_name", "")),
        load_in_4bit=bool(job.config.get("load_in_4bit", False)),
    )


@dataclass(frozen=True)
class ChatModel:
    id: str
    job: Job
    base: bool


def chat_models(manager: JobManager, limit: int = 1000) -> list[ChatModel]:
    """Every job one can chat with, newest first, each followed by its base model."""
    out: list[ChatModel] = []
    for job in manager.list(CHAT_STATUSES, limit=limit):
        if weights_folder(job) is not None:
            out += [ChatModel(job.id, job, False), ChatModel(job.id + BASE_SUFFIX, job, True)]
    return out


def resolve(manager: JobManager, model_id: str) -> ModelSpec:
    """The spec for a model id (`<job id>` or `<job id>:base`); raises UnknownModel saying why not."""
    job_id, base = (model_id[: -len(BASE_SUFFIX)], True) if model_id.endswith(BASE_SUFFIX) else (model_id, False)
    try:
        job = manager.get(job_id)
    except JobNotFound:
        raise UnknownModel(model_id, "does not exist: give a job id, or a job id followed by ':base' "
                                     "(GET /v1/models lists them)") from None
    spec = spec_for(job, base)
    if spec is None:
        if job.status not in CHAT_STATUSES:
            reason = (f"is not available: job {job_id} is {job.status.value}; a job answers once it is completed, "
                      "stopped, or interrupted with a checkpoint")
        else:
            reason = f"is not available: job {job_id} has no saved weights (its output folder is empty or gone)"
        raise UnknownModel(model_id, reason)
    return spec
