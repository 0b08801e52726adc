"""Which jobs one can chat with, under which model ids, and where their weights are.

A job can answer once it has weights: a completed or stopped job in its
output folder (a stop with save writes the model trained so far there), an
interrupted one in its latest checkpoint. Its id names the result; `<id>:base`
names the base model it was trained from, spoken to with the job's tokenizer
and chat template, so both answer the same prompt text. An export job is no
chat model (its source job is).

Jobs come from the caller (`JobSource`: the API's and the CLI's `JobManager`),
read through `ChatJob`, what chat needs of a job; this module imports nothing
of jobs/.

A job's weights are the files its worker wrote before the job ended. Another
job may run into the same output folder later (a job file run again) and write
over them: weights written after the job's `finished_at` (+ `SLACK_S`) are not
its own any more, and asking for it is a 409 (`WeightsReplaced`), not another
job's answer under its name. `fingerprint()` (the weights files' names, sizes
and modification times) goes with each spec, so the worker's cache reloads
weights that changed on disk.

OpenAI's fine-tuning API (api/fine_tuning.py) names a completed job's result
`ft:<base>:<suffix>:<job id>` (`fine_tuned_name`) and a checkpoint of it
`...:ckpt-step-<N>`; both resolve by the job id at the end. A saved step of any job is `<job id>:step-<N>`
(its `checkpoint-N` folder; `checkpoint_steps` lists them).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tunestudio.checkpoints import fingerprint, latest_checkpoint, weights_files
from tunestudio.inference_protocol import ModelSpec
from tunestudio.kinds import spec_of

# Statuses by their value (jobs/status.py's JobStatus is a StrEnum, and events.StatusEvent carries it so too).
FINISHED = ("completed", "stopped")  # a job whose output folder holds what it trained
CHAT_STATUSES = (*FINISHED, "interrupted")
BASE_SUFFIX = ":base"
SLACK_S = 2.0  # a job's weights may be this much newer than its finished_at (clock and timestamp granularity)
FINE_TUNED = "ft:"
SUFFIX = re.compile(r"^[A-Za-z0-9._-]{1,64}$")  # what a job's name must be to stand in an ft: name
_CHECKPOINT_STEP = re.compile(r":ckpt-step-(\d{1,12})$")
_JOB_STEP = re.compile(r":step-(\d{1,12})$")


class ChatJob(Protocol):
    """What chat reads of a job (jobs/models.py's `Job` is one); nothing here writes to it."""

    id: str
    kind: str  # a kind of job (tunestudio.kinds): "train", "export", "bench"
    source_job: str | None  # an export's
    status: str  # a JobStatus value
    config: Any  # a training job's JobConfig: its model_name, load_in_4bit (read for kind "train" only)
    created_at: float
    finished_at: float | None
    output_dir: str | None
    checkpoint: str | None
    name: str | None


class JobSource(Protocol):
    """Where chat finds jobs (the manager is one, handed in by the API or the CLI)."""

    def get(self, job_id: str) -> ChatJob:
        """The job; raises LookupError (the manager's JobNotFound) if there is none."""

    def list(self, status: list[str] | None = None, limit: int = 50) -> Sequence[ChatJob]:
        """Jobs in these statuses (None: any), newest first."""


class UnknownModel(LookupError):
    """No job answers to this model id; the message says why, for the user."""

    status, code = 404, "model_not_found"

    def __init__(self, model_id: str, reason: str) -> None:
        super().__init__(f"model {model_id!r} {reason}")
        self.model_id = model_id


class WeightsReplaced(UnknownModel):
    """The job's folder holds weights written after it ended: another job's, not its own."""

    status, code = 409, "model_replaced"


def _has_weights(folder: Path) -> bool:
    return (folder / "adapter_config.json").is_file() or (folder / "config.json").is_file()


def weights_folder(job: ChatJob) -> Path | None:
    """The folder holding the job's adapter or model, or None if it has none (yet, or any more)."""
    if job.status not in CHAT_STATUSES:
        return None
    if job.status in FINISHED and job.output_dir:
        out = Path(job.output_dir)
        if _has_weights(out):
            return out
    checkpoint = job.checkpoint or latest_checkpoint(job.output_dir)
    if checkpoint and _has_weights(Path(checkpoint)):
        return Path(checkpoint)
    return None


def replaced(job: ChatJob, folder: Path) -> bool:
    """Whether weights in the job's folder were written after the job ended (so not by it)."""
    if job.finished_at is None:
        return False
    newest = 0
    for path in weights_files(folder):
        with contextlib.suppress(OSError):
            newest = max(newest, path.stat().st_mtime_ns)
    return newest / 1e9 > job.finished_at + SLACK_S


def fine_tuned_name(job: ChatJob) -> str:
    """`ft:<base>:<suffix>:<job id>`: the base model as given (a local folder by its name), the job's name as
    the suffix when it is one (else empty, as OpenAI writes it)."""
    raw = job.config.model_name
    base = Path(raw).name if raw.startswith(("/", ".", "~")) else raw
    suffix = job.name if job.name and SUFFIX.match(job.name) else ""
    return f"{FINE_TUNED}{base}:{suffix}:{job.id}"


def spec_for(job: ChatJob, base: bool, folder: Path | None = None) -> ModelSpec | None:
    """The spec of the job's weights (or those of `folder`, one of its checkpoints); None if it has none."""
    folder = folder or weights_folder(job)
    if folder is None:
        return None
    has_tokenizer = (folder / "tokenizer_config.json").is_file()
    return ModelSpec(
        job_id=job.id,
        base=base,
        base_model=job.config.model_name,
        weights=str(folder),
        kind="adapter" if (folder / "adapter_config.json").is_file() else "full",
        tokenizer=str(folder) if has_tokenizer else job.config.model_name,
        load_in_4bit=job.config.load_in_4bit,
        fingerprint=fingerprint(folder),
        modality=job.config.modality,
    )


@dataclass(frozen=True)
class ChatModel:
    id: str
    job: ChatJob
    base: bool


def chat_models(jobs: JobSource, limit: int = 1000) -> list[ChatModel]:
    """Every job one can chat with, newest first, each followed by its base model (and a completed one by its
    ft: name and its saved checkpoints' `...:ckpt-step-N`, as OpenAI lists a fine-tuning job's checkpoints)."""
    out: list[ChatModel] = []
    for job in jobs.list(list(CHAT_STATUSES), limit=limit):
        if spec_of(job.kind).trains and weights_folder(job) is not None:
            out += [ChatModel(job.id, job, False), ChatModel(job.id + BASE_SUFFIX, job, True)]
            if job.status == "completed":
                name = fine_tuned_name(job)
                out += [ChatModel(name, job, False),
                        *(ChatModel(f"{name}:ckpt-step-{step}", job, False) for step in checkpoint_steps(job))]
    return out


def checkpoint_steps(job: ChatJob) -> list[int]:
    """The steps of the job's saved checkpoints that hold weights (`checkpoint-N` in its output folder), in order;
    each answers as `<job id>:step-N`."""
    if not job.output_dir:
        return []
    try:
        found = [int(m.group(1)) for p in Path(job.output_dir).iterdir()
                 if (m := re.fullmatch(r"checkpoint-(\d{1,12})", p.name)) and _has_weights(p)]
    except OSError:  # no output folder (yet, or any more)
        return []
    return sorted(found)


def resolve(jobs: JobSource, model_id: str) -> ModelSpec:
    """The spec for a model id (`<job id>`, `<job id>:base`, `<job id>:step-N`, `ft:...:<job id>[:ckpt-step-N]`);
    raises UnknownModel saying why not."""
    job_id, base = (model_id[: -len(BASE_SUFFIX)], True) if model_id.endswith(BASE_SUFFIX) else (model_id, False)
    step = _CHECKPOINT_STEP.search(model_id) if model_id.startswith(FINE_TUNED) else None
    if model_id.startswith(FINE_TUNED):
        job_id, base = model_id[: step.start() if step else None].rpartition(":")[2], False
    elif not base and (step := _JOB_STEP.search(model_id)):
        job_id = model_id[: step.start()]
    try:
        job = jobs.get(job_id)
    except LookupError:
        raise UnknownModel(model_id, "does not exist: give a job id, or a job id followed by ':base' or by "
                                     "':step-N' (GET /v1/models lists them)") from None
    if not spec_of(job.kind).trains:  # an export, or a benchmark: their source job is the model
        what = "an export" if job.kind == "export" else "a benchmark"
        raise UnknownModel(model_id, f"is not a chat model: job {job_id} is {what}; chat with its source job "
                                     f"{job.source_job}")
    checkpoint = Path(job.output_dir or "") / f"checkpoint-{step.group(1)}" if step else None
    if checkpoint is not None and not _has_weights(checkpoint):
        raise UnknownModel(model_id, f"is not available: job {job_id} has no {checkpoint.name} with weights")
    spec = spec_for(job, base, checkpoint)
    if spec is not None and replaced(job, Path(spec.weights)):
        raise WeightsReplaced(model_id, f"is not available: job {job_id}'s weights in {spec.weights} were replaced "
                                        f"{_by_whom(jobs, job)}; its model is no longer on disk")
    if spec is None:
        if job.status not in CHAT_STATUSES:
            reason = (f"is not available: job {job_id} is {job.status}; a job answers once it is completed, "
                      "stopped, or interrupted with a checkpoint")
        else:
            reason = f"is not available: job {job_id} has no saved weights (its output folder is empty or gone)"
        raise UnknownModel(model_id, reason)
    return spec


def _by_whom(jobs: JobSource, job: ChatJob) -> str:
    """'by a later job (ID)': the newest other job with the same output folder, created after this one."""
    out = Path(job.output_dir or "").resolve()
    for other in jobs.list(limit=1000):  # newest first
        if (other.id != job.id and spec_of(other.kind).trains and other.output_dir and other.created_at > job.created_at
                and Path(other.output_dir).resolve() == out):
            return f"by a later job ({other.id})"
    return "after the job ended (by another job, or by hand)"
