"""Request and response models of the HTTP API."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from tunestudio.events import Best, Evaluation, HeldOut, Sample
from tunestudio.inference import weights_folder
from tunestudio.jobs import Job, JobKind, JobStatus, owned_artefacts


class Artefact(BaseModel):
    name: str
    bytes: int
    is_dir: bool


class JobOut(BaseModel):
    id: str
    kind: JobKind = Field(description='The kind of job (GET /api/system/kinds): "train", or "export"/"bench" (then '
                                      'source_job is the job it exports or measures).')
    kind_label: str = Field(description='How the page names this kind of job ("training job", "export", ...).')
    trains: bool = Field(description="The kind trains a model of its own (else it is about source_job).")
    source_job: str | None = None
    status: JobStatus
    phase: str | None
    message: str
    error: str | None
    config: dict[str, Any]
    created_at: float
    started_at: float | None
    finished_at: float | None
    output_dir: str | None
    checkpoint: str | None
    resumed_from: str | None
    request_id: str | None
    progress: dict[str, Any] | None = Field(description="The latest metric record.")
    final_metrics: dict[str, Any] | None
    artefacts: list[Artefact]
    last_seq: int
    samples: list[Sample] = Field(default_factory=list, description="sample_prompts, before and after training.")
    evaluation: Evaluation | None = Field(
        default=None, description="Before/after metrics on held-out rows: {metrics: {name: {before, after}}, "
                                  "rows, examples}.")
    best: Best | None = Field(
        default=None, description="With early stopping: the best evaluation {step, metric, value, checkpoint}; "
                                  "with keep_best the artefacts are that step's weights.")
    held_out: HeldOut | None = Field(
        default=None, description="The rows held out of the data for evaluation: {file, rows, seed, source}; a "
                                  "resume and a clone (held_out_rows) hold out the same ones.")
    storage: str | None = Field(
        default=None, description="A job run on a Ray cluster with TUNESTUDIO_RAY_STORAGE: the storage URI its "
                                  "checkpoints and artefacts were written to (and copied into output_dir from).")

    resolved: dict[str, str] = Field(
        default_factory=dict, description="What the worker decided where the config left it a choice: precision, "
                                          "gradient_checkpointing, lora_targets (the layers LoRA adapted), images.")

    name: str | None = None
    notes: str | None = None
    sweep_id: str | None = Field(default=None, description="A sweep's trial: its sweep (GET /api/sweeps/{id}).")
    trial: int | None = Field(default=None, description="A sweep's trial: its number in the sweep.")
    resumed_by: str | None = Field(default=None, description="The job that resumed this one.")
    queue_position: int | None = Field(default=None, description="1: the next queued job to start.")
    # What the job allows now, from tunestudio.jobs.status: clients never keep their own status sets.
    stoppable: bool
    cancellable: bool
    resumable: bool
    deletable: bool
    is_terminal: bool = Field(description="The job has ended (completed, stopped, cancelled, failed, interrupted).")
    has_result: bool = Field(description="Completed or stopped with a save: a result to export or compare.")
    chattable: bool = Field(description="It has weights one can chat with (GET /v1/models lists it).")

    @classmethod
    def of(cls, job: Job, with_artefacts: bool = True, queue_position: int | None = None) -> JobOut:
        result = job.result or {}
        return cls(
            **job.model_dump(exclude={"log_path", "result", "config"}),
            config=job.config.public_dict(),
            kind_label=job.spec.label, trains=job.spec.trains,
            artefacts=_artefacts(job) if with_artefacts else [],
            samples=result.get("samples") or [],
            evaluation=result.get("evaluation"),
            best=result.get("best"),
            held_out=result.get("held_out"),
            storage=result.get("storage"),
            resolved=result.get("resolved") or {},
            queue_position=queue_position,
            stoppable=job.stoppable, cancellable=job.cancellable, resumable=job.resumable, deletable=job.deletable,
            is_terminal=job.is_terminal, has_result=job.has_result,
            chattable=job.spec.trains and weights_folder(job) is not None,
        )


def _artefacts(job: Job) -> list[Artefact]:
    """What the job wrote in its output folder (jobs.artefacts.owned): a file the user put there is not listed."""
    out = []
    for path in owned_artefacts(job):
        size = path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        out.append(Artefact(name=path.name, bytes=size, is_dir=path.is_dir()))
    return out


class JobCreated(BaseModel):
    id: str
    status: JobStatus


class JobPage(BaseModel):
    items: list[JobOut]
    total: int
    limit: int
    offset: int


class StopRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    save: bool = True


class ResumeRequest(BaseModel):
    """Secrets are never stored: a job resumed after a server restart needs them again if it used them."""

    model_config = ConfigDict(extra="forbid")

    hf_token: SecretStr | None = None
    wandb_token: SecretStr | None = None
    num_processes: int | None = Field(default=None, ge=1, le=256, description="Ranks for the rest; unset: as before.")

    def secrets(self) -> dict[str, str]:
        return {k: v.get_secret_value() for k, v in (("hf_token", self.hf_token), ("wandb_token", self.wandb_token))
                if v is not None}


class RenameRequest(BaseModel):
    """A job's name and notes; an empty or missing one is cleared."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(default=None, max_length=200)
    notes: str | None = Field(default=None, max_length=10_000)


class MetricsOut(BaseModel):
    job_id: str
    records: list[dict[str, Any]]


class JobMessage(BaseModel):
    """One event of a job's stream that says something (not progress, not a status change)."""

    seq: int
    kind: str = Field(description='"log", "warning", "failed" or "completed".')
    ts: float | None = None
    level: str | None = Field(default=None, description="A log's level.")
    message: str = Field(default="", description="Empty for a completed event.")


class MessagesOut(BaseModel):
    job_id: str
    items: list[JobMessage] = Field(description="Oldest first.")


# A row's picture as the rows file keeps it (worker/train/image_eval.thumbnail): an inline image, no link.
PICTURE = re.compile(r"data:image/(?:png|jpeg|gif|webp);base64,[A-Za-z0-9+/]+={0,2}")
MAX_PICTURE_CHARS = 1 << 18  # a 96 px thumbnail is a few KB; a quarter of a MB is far beyond any
MAX_CLIP_CHARS = 1_400_000  # 30 s of 16 kHz 16-bit mono WAV, in base64
CLIP = re.compile(r"[A-Za-z0-9+/]*={0,2}")


class EvalRowOut(BaseModel):
    """One held-out row of a finished job's final evaluation."""

    index: int = Field(description="Its place among the held-out rows (0-based).")
    file: str | None = Field(default=None, description="The dataset it comes from.")
    line: int | None = Field(default=None, description="Its row in that dataset (1-based: a line of a JSONL file).")
    prompt: str
    reference: str = Field(description="The dataset's reply (a plain text row: its text).")
    loss: float | None = Field(default=None, description="After training: mean cross-entropy per reference token.")
    loss_before: float | None = Field(default=None, description="The same, of the base model.")
    answer: str | None = Field(default=None, description="The trained model's answer (answered rows only).")
    answer_before: str | None = None
    exact_match: float | None = None
    token_f1: float | None = None
    rouge_l: float | None = None
    exact_match_before: float | None = None
    token_f1_before: float | None = None
    rouge_l_before: float | None = None
    # a tool row's calls (rows with tools only; tool_name, tool_args and tool_arg_match where the reference calls):
    # worker/train/tool_scores.py
    tool_choice: float | None = Field(default=None, description="1 when it called a tool exactly when the "
                                      "reference does (and answered when the reference answers).")
    tool_name: float | None = Field(default=None, description="Share of the calls made to the right function.")
    tool_args: float | None = Field(default=None, description="Share of the calls with the right function and "
                                    "arguments equal as JSON.")
    tool_arg_match: float | None = Field(default=None, description="Share of the arguments with the right value.")
    tool_choice_before: float | None = None
    tool_name_before: float | None = None
    tool_args_before: float | None = None
    tool_arg_match_before: float | None = None
    images: list[str] = Field(default_factory=list, description="An image row's pictures, in its order: small PNGs "
                              "(96 px on their longest side) as data: URLs, which the job page shows beside its "
                              "prompt and answers.")
    # an audio row's clip (worker/train/speech_eval.py): its error rates and the clip, which the page plays
    wer: float | None = Field(default=None, description="Word error rate of the trained model's transcript.")
    cer: float | None = Field(default=None, description="Character error rate of the trained model's transcript.")
    wer_before: float | None = None
    cer_before: float | None = None
    seconds: float | None = Field(default=None, description="An audio row's clip length.")
    audio: str | None = Field(default=None, description="An audio row's clip as a WAV data: URL (clips up to 30 s).")

    @field_validator("audio", mode="before")
    @classmethod
    def _clip_only(cls, value: Any) -> str | None:
        """Only an inline WAV of a sane size passes: the page puts it in <audio src>."""
        if isinstance(value, str) and len(value) <= MAX_CLIP_CHARS and value.startswith("data:audio/wav;base64,") \
                and CLIP.fullmatch(value.removeprefix("data:audio/wav;base64,")):
            return value
        return None

    @field_validator("images", mode="before")
    @classmethod
    def _pictures_only(cls, value: Any) -> list[str]:
        """Only inline pictures of a sane size pass: the page puts them in <img src>, and the rows file is a file
        on disk that anything may have written; what is not one is left out, not a server error."""
        if not isinstance(value, list):
            return []
        return [v for v in value if isinstance(v, str) and len(v) <= MAX_PICTURE_CHARS and PICTURE.fullmatch(v)]


class EvalRowsOut(BaseModel):
    job_id: str
    by: str = Field(description="loss, or a generation metric: exact_match, token_f1, rouge_l, and on tool rows "
                    "tool_choice, tool_name, tool_args, tool_arg_match; on an audio job's rows wer, cer.")
    order: str = Field(description="worst: highest loss or lowest metric first; best: the other way.")
    total: int = Field(description="Every evaluated row.")
    ranked: int = Field(description="Rows that have the figure ordered by (the others come last).")
    offset: int
    limit: int
    loss: str = Field(description="What a row's loss is.")
    metrics: list[str]
    rows: list[EvalRowOut]


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorOut(BaseModel):
    detail: ErrorDetail


class OpenAIErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIError(BaseModel):
    """Every error under /v1, in OpenAI's shape."""

    error: OpenAIErrorBody


OPENAI_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": OpenAIError, "description": what} for code, what in (
        (400, "Invalid request"), (401, "A token is required"), (403, "Not from this server's origin"),
        (404, "No such model, file or job"), (409, "Not possible in the job's current state, or the model's files "
                                                "are another job's now"),
        (413, "Request body too large"), (422, "Invalid request"), (503, "The inference worker could not answer"))
}

ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorOut, "description": "The Host header names another server"},
    401: {"model": ErrorOut, "description": "A token is required"},
    403: {"model": ErrorOut, "description": "A state-changing request that is not JSON, or from another origin"},
    404: {"model": ErrorOut, "description": "No such job"},
    409: {"model": ErrorOut, "description": "Not possible in the job's current status"},
    413: {"model": ErrorOut, "description": "Request body too large"},
    422: {"model": ErrorOut, "description": "Invalid request"},
    503: {"model": ErrorOut, "description": "The job database does not accept writes now (disk full, locked...)"},
}
