"""The messages between parent and worker, and nothing else.

Worker → parent: `Phase`, `Progress`, `Log`, `WarningEvent`, `Resources`,
`Completed`, `Failed`, each with a `seq` that only ever increases within one worker and a
timestamp. Parent → worker: the one command, `Stop(save)`.

A job's stream, as stored and served, is the worker's events plus the
manager's own: `StatusEvent` (every status change), `Log` (e.g. "waiting for
a slot") and `Failed` (a worker that died without a word). Two numberings, on
purpose: the worker's `seq` orders and de-duplicates what one worker process
sends (the supervisor drops repeats); the manager renumbers every event of the
job's stream, its own included, as the stream's `seq` (the SSE `id:`), which
also continues across the worker processes of a job and its restarts. The
worker's own seq is not kept in the stream.

Both sides serialise with `model_dump_json()` and read with `parse_event` /
`parse_command`, which raise `pydantic.ValidationError` on anything malformed,
so a reader can count and skip garbage instead of dying on it.
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

WorkerPhase = Literal["loading_model", "loading_dataset", "training", "saving"]
# What the worker does inside a phase, between its big steps: a job's status does not change with these (the
# manager records them as the job's `phase`). The base model is judged before training, the result after it.
WorkerStep = Literal["evaluating_base", "generating_base", "evaluating", "generating"]

# Files a training job leaves in its output folder that the parent reads: which rows it held out for evaluation
# (written before training, so a resume of a stopped or failed job finds it; worker/data/held_out.py), and its
# held-out rows one by one after the final evaluation (worker/train/evaluation.py).
HELD_OUT_FILE = "held_out.json"
EVAL_ROWS_FILE = "eval_rows.json"


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seq: int = Field(ge=0)
    ts: float = Field(default_factory=time.time)


class Phase(_Message):
    """A phase (a status of the job) or a step inside one; done of total: how far that step is (rows, batches)."""

    kind: Literal["phase"] = "phase"
    phase: WorkerPhase | WorkerStep
    message: str = ""
    done: int | None = Field(default=None, ge=0)
    total: int | None = Field(default=None, ge=0)


class Progress(_Message):
    """One logging step. Eval-only records have eval_loss and no loss; `extra` holds the method's metrics."""

    kind: Literal["progress"] = "progress"
    step: int = Field(ge=0)
    total_steps: int = Field(ge=0)
    epoch: float | None = None
    loss: float | None = None
    learning_rate: float | None = None
    grad_norm: float | None = None
    eval_loss: float | None = None
    num_tokens: int | None = None  # all ranks together
    tokens_per_second: float | None = None  # all ranks together
    global_batch_size: int | None = None  # sequences per optimizer step, over every rank
    elapsed_seconds: float | None = None
    eta_seconds: float | None = None
    peak_memory_mb: float | None = None  # the worker's peak so far: process RSS on a CPU, allocated on a GPU
    # The method's own metrics by TRL's names, e.g. "rewards/margins" (DPO), "kl" (KTO), "reward" and
    # "rewards/exact_match/mean" (GRPO); eval records carry them with an "eval_" prefix. None: none logged.
    extra: dict[str, float] | None = None

    def record(self) -> dict[str, Any]:
        """The metric record (one row of metrics.jsonl / the metrics table)."""
        return self.model_dump(exclude={"kind", "seq"})


class Log(_Message):
    kind: Literal["log"] = "log"
    level: Literal["debug", "info", "warning", "error"] = "info"
    message: str


class WarningEvent(_Message):
    kind: Literal["warning"] = "warning"
    message: str


class Sample(BaseModel):
    """One prompt generated from the base model and from the trained one."""

    model_config = ConfigDict(extra="forbid")

    prompt: str
    before: str
    after: str | None = None


class BeforeAfter(BaseModel):
    """One metric of the held-out evaluation, on the base model and on the result."""

    model_config = ConfigDict(extra="forbid")

    before: float | None = None
    after: float | None = None


class EvalExample(BaseModel):
    """One held-out row: its prompt, the dataset's reply, and what each model answered."""

    model_config = ConfigDict(extra="forbid")

    prompt: str
    reference: str
    before: str
    after: str | None = None


class Evaluation(BaseModel):
    """Before/after metrics on up to `eval_generate_rows` held-out rows (see tunestudio/worker/train/evaluation.py).

    metrics: exact_match, token_f1, rouge_l (means over the generated rows, 0..1), eval_loss and perplexity
    (over the whole eval split); a metric that could not be measured is absent or None.
    """

    model_config = ConfigDict(extra="forbid")

    rows: int = Field(ge=0, description="Held-out rows answered by both models.")
    metrics: dict[str, BeforeAfter] = Field(default_factory=dict)
    examples: list[EvalExample] = Field(default_factory=list)
    rows_file: str | None = Field(default=None, description="Every evaluated held-out row with its loss, reference "
                                  "and answers (EVAL_ROWS_FILE; GET /api/jobs/{id}/rows).")
    scored_rows: int = Field(default=0, ge=0, description="Held-out rows whose loss was measured one by one.")


class HeldOut(BaseModel):
    """The rows a job held out of its data for evaluation, recorded in `file` (HELD_OUT_FILE) by identity."""

    model_config = ConfigDict(extra="forbid")

    file: str
    rows: int = Field(ge=0)
    seed: int | None = None
    source: str | None = Field(default=None, description="The held_out_rows record it reused; None: a new split.")


class Best(BaseModel):
    """The best evaluation of a job with early stopping (worker/train/best.py): its step, the metric and its value.

    checkpoint: the checkpoint of that step (keep_best), whose weights the job's artefacts are; None when the job
    kept the last step's weights instead.
    """

    model_config = ConfigDict(extra="forbid")

    step: int = Field(ge=0)
    metric: str
    value: float
    checkpoint: str | None = None

    def describe(self) -> str:
        """As the log and the summaries say it: "best at step 40: exact_match 0.8200"."""
        return f"best at step {self.step}: {self.metric} {self.value:.4f}"


class Completed(_Message):
    """Training ended. stopped: a stop command ended it early; saved: artefacts were written.

    reason: why training ended before max_steps without a stop command (early stopping); best: the best
    evaluation when early stopping watched one.
    """

    kind: Literal["completed"] = "completed"
    output_dir: str | None
    stopped: bool = False
    saved: bool = True
    checkpoint: str | None = None
    global_step: int = 0
    metrics: dict[str, float] = Field(default_factory=dict)
    samples: list[Sample] = Field(default_factory=list)
    evaluation: Evaluation | None = None
    best: Best | None = None
    reason: str = ""
    benchmarks: dict[str, Any] | None = None  # a bench job's: per task and metric, before and after
    held_out: HeldOut | None = None
    storage: str | None = None  # a Ray job with TUNESTUDIO_RAY_STORAGE: the URI its files were written to
    # what the worker decided where the config left it a choice: precision, activation checkpointing, the layers
    # LoRA adapted (as the vision switches chose them, for an image job), the image size
    resolved: dict[str, str] = Field(default_factory=dict)


class Resources(_Message):
    """What the job's processes use now, sampled by the worker every few seconds (worker/resources.py).

    cpu_percent: the worker and its children together, 100 = one core busy; rss_mb: their resident memory
    together; gpu_percent and gpu_memory_mb (what NVML sees them hold, else the worker's reserved CUDA memory):
    None when the job does not use CUDA.
    """

    kind: Literal["resources"] = "resources"
    cpu_percent: float = Field(ge=0)
    rss_mb: float = Field(ge=0)
    processes: int = Field(default=1, ge=1)
    gpu_percent: float | None = Field(default=None, ge=0)
    gpu_memory_mb: float | None = Field(default=None, ge=0)


class Failed(_Message):
    kind: Literal["failed"] = "failed"
    message: str
    traceback: str = ""


class StatusEvent(_Message):
    """The manager's: a job's status changed (a `JobStatus` value; the stream ends after a terminal one)."""

    kind: Literal["status"] = "status"
    status: str
    message: str = ""
    error: str | None = None


Event = Annotated[
    Phase | Progress | Log | WarningEvent | Resources | Completed | Failed,
    Field(discriminator="kind"),
]

# What a job's stream holds: the worker's events and the manager's status changes.
StreamEvent = Annotated[
    Phase | Progress | Log | WarningEvent | Resources | Completed | Failed | StatusEvent,
    Field(discriminator="kind"),
]


class Stop(BaseModel):
    """Parent → worker: stop at the next step boundary; save=True writes a resumable checkpoint."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["stop"] = "stop"
    save: bool = True


_EVENT = TypeAdapter(Event)
_STREAM_EVENT = TypeAdapter(StreamEvent)


def parse_event(data: str | bytes | dict[str, Any]) -> Event:
    """Parse one event from JSON text or a dict; raises pydantic.ValidationError."""
    if isinstance(data, dict):
        return _EVENT.validate_python(data)
    return _EVENT.validate_json(data)


def parse_stream_event(data: str | bytes | dict[str, Any]) -> StreamEvent:
    """Parse one event of a job's stream (stored without its worker seq: it gets seq 0)."""
    if isinstance(data, dict):
        return _STREAM_EVENT.validate_python({"seq": 0, **data})
    return _STREAM_EVENT.validate_python({"seq": 0, **json.loads(data)})


def parse_command(data: str | bytes) -> Stop:
    return Stop.model_validate_json(data)
