"""The messages between parent and worker, and nothing else.

Worker → parent: `Phase`, `Progress`, `Log`, `WarningEvent`, `Completed`,
`Failed`, each with a `seq` that only ever increases within one worker and a
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


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seq: int = Field(ge=0)
    ts: float = Field(default_factory=time.time)


class Phase(_Message):
    kind: Literal["phase"] = "phase"
    phase: WorkerPhase
    message: str = ""


class Progress(_Message):
    """One logging step. Eval-only records have eval_loss and no loss."""

    kind: Literal["progress"] = "progress"
    step: int = Field(ge=0)
    total_steps: int = Field(ge=0)
    epoch: float | None = None
    loss: float | None = None
    learning_rate: float | None = None
    grad_norm: float | None = None
    eval_loss: float | None = None
    num_tokens: int | None = None
    tokens_per_second: float | None = None
    elapsed_seconds: float | None = None
    eta_seconds: float | None = None
    peak_memory_mb: float | None = Field(default=None, description="The worker's peak memory so far: GPU, else RSS.")

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


class Completed(_Message):
    """Training ended. stopped: a stop command ended it early; saved: artefacts were written."""

    kind: Literal["completed"] = "completed"
    output_dir: str | None
    stopped: bool = False
    saved: bool = True
    checkpoint: str | None = None
    global_step: int = 0
    metrics: dict[str, float] = Field(default_factory=dict)
    samples: list[Sample] = Field(default_factory=list)


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
    Phase | Progress | Log | WarningEvent | Completed | Failed,
    Field(discriminator="kind"),
]

# What a job's stream holds: the worker's events and the manager's status changes.
StreamEvent = Annotated[
    Phase | Progress | Log | WarningEvent | Completed | Failed | StatusEvent,
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
