"""What the manager hands out: plain data about a job and its events.

A job's `config` is typed by its kind, as it was validated at submit: a `JobConfig` (train), an `ExportConfig`
(export) or a `BenchConfig` (bench), read back from the stored public dict (no secrets) by `stored_config`.
"""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, SkipValidation, ValidationError, model_validator

from tunestudio.config import JobConfig
from tunestudio.jobs.status import CANCELLABLE, RESUMABLE, STOPPABLE, JobStatus
from tunestudio.kinds import KINDS, AnyConfig, JobKindSpec, spec_of

log = logging.getLogger(__name__)

# The kinds of job (tunestudio.kinds, one entry each): "train", "export", "bench" (a benchmark of source_job).
JobKind = Literal[tuple(KINDS)]  # type: ignore[valid-type]
CONFIG_TYPES: dict[str, type[AnyConfig]] = {name: spec.config for name, spec in KINDS.items()}


def stored_config(kind: str, public: dict[str, Any]) -> AnyConfig:
    """The config of a job of `kind` from its stored public dict, validated as at submit.

    A row an older tunestudio wrote may hold a field this one no longer has, or a value it now refuses: it is
    read without the unknown fields and, if it still does not validate, as stored (unvalidated), so the job
    stays listable; a new run of it is validated again (resume, clone, the worker).

    Jobs are listed often (the page's polls, /v1/models over every job) and a stored config never changes, so the
    same text is validated once (an LRU of recent configs, 0.2 ms each): the instances are shared, read them only."""
    return _validated(kind, json.dumps(public, sort_keys=True))


@functools.lru_cache(maxsize=4096)
def _validated(kind: str, text: str) -> AnyConfig:
    cls, public = CONFIG_TYPES[kind], json.loads(text)
    try:
        return cls.model_validate(public)
    except ValidationError as exc:
        known = {k: v for k, v in public.items() if k in cls.model_fields}
        try:
            return cls.model_validate(known)
        except ValidationError:
            log.warning("a stored %s config no longer validates (%s); read as stored", kind,
                        exc.errors()[0].get("msg", ""))
            return cls.model_construct(**known)


class Job(BaseModel):
    id: str
    kind: JobKind = "train"
    source_job: str | None = None  # an export: the job whose result it exports; a bench: the job it measures
    status: JobStatus
    phase: str | None = None
    message: str = ""
    error: str | None = None
    config: SkipValidation[AnyConfig]  # validated by kind, once (stored_config); checked in _config_of_kind
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    output_dir: str | None = None
    checkpoint: str | None = None
    resumed_from: str | None = None
    request_id: str | None = None
    final_metrics: dict[str, Any] | None = None
    result: dict[str, Any] | None = None  # the Completed event's samples, evaluation and best
    progress: dict[str, Any] | None = None
    log_path: str | None = None
    worker_pid: int | None = None
    last_seq: int = 0
    name: str | None = None
    notes: str | None = None
    sweep_id: str | None = None  # a sweep's trial (tunestudio/sweeps/): its sweep and trial number
    trial: int | None = None
    resumed_by: str | None = None  # the job that resumed this one (read with the row, never stored)

    @model_validator(mode="before")
    @classmethod
    def _typed_config(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("config"), dict):
            data = {**data, "config": stored_config(data.get("kind") or "train", data["config"])}
        return data

    @model_validator(mode="after")
    def _config_of_kind(self) -> Job:
        if not isinstance(self.config, CONFIG_TYPES[self.kind]):
            raise ValueError(f"a {self.kind} job's config is a {CONFIG_TYPES[self.kind].__name__}, "
                             f"not a {type(self.config).__name__}")
        return self

    @property
    def spec(self) -> JobKindSpec:
        """What this kind of job is (tunestudio.kinds): ask it, rather than comparing `kind` with a name."""
        return spec_of(self.kind)

    @property
    def train_config(self) -> JobConfig:
        """The config of a training job (AssertionError for another kind: a caller checks `kind` first)."""
        assert isinstance(self.config, JobConfig), f"job {self.id} is a {self.kind} job"
        return self.config

    @property
    def resumable(self) -> bool:
        """A job resumes once: not when another job resumed it already; an export never."""
        return (self.spec.trains and self.status in RESUMABLE and self.resumed_by is None
                and self.checkpoint is not None and Path(self.checkpoint).is_dir())

    @property
    def stoppable(self) -> bool:
        return self.status in STOPPABLE

    @property
    def cancellable(self) -> bool:
        return self.status in CANCELLABLE

    @property
    def is_terminal(self) -> bool:
        return self.status.is_terminal

    @property
    def has_result(self) -> bool:
        """Whether the job left a result one can export or compare: completed, or stopped with a save."""
        finished = self.status in (JobStatus.completed, JobStatus.stopped)
        return self.spec.trains and finished and bool(self.output_dir)

    @property
    def deletable(self) -> bool:
        """What JobManager.delete allows (without artefacts): a finished job no other job resumed from."""
        return self.status.is_terminal and self.resumed_by is None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Job:
        fields = {k: row.get(k) for k in cls.model_fields}
        fields["message"] = fields["message"] or ""
        fields["last_seq"] = fields["last_seq"] or 0
        fields["kind"] = fields["kind"] or "train"
        return cls.model_validate(fields)


class JobEvent:
    """One event of a job's stream, numbered by the manager (seq is per job, from 1).

    It travels as JSON text (stored, streamed as is) and is read as a dict; it
    is made from either, and the other is computed on first use: a progress
    event nobody listens to is never turned into text.
    """

    __slots__ = ("_data", "_text", "kind", "seq")

    def __init__(self, seq: int, kind: str, text: str | None = None, data: dict[str, Any] | None = None) -> None:
        if text is None and data is None:
            raise ValueError("a JobEvent needs its text or its data")
        self.seq = seq
        self.kind = kind
        self._text = text
        self._data = data

    @property
    def text(self) -> str:
        if self._text is None:
            self._text = json.dumps(self._data)
        return self._text

    @property
    def data(self) -> dict[str, Any]:
        if self._data is None:
            self._data = json.loads(self.text)
        return self._data

    @property
    def is_end(self) -> bool:
        """The last event of a job's stream: its final status."""
        return self.kind == "status" and JobStatus(self.data["status"]).is_terminal

    def __repr__(self) -> str:
        return f"JobEvent(seq={self.seq}, kind={self.kind!r}, text={self.text!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, JobEvent):
            return NotImplemented
        return (self.seq, self.kind, self.data) == (other.seq, other.kind, other.data)

    def __hash__(self) -> int:
        return hash((self.seq, self.kind))


class JobNotFound(LookupError):
    def __init__(self, job_id: str) -> None:
        super().__init__(f"no job {job_id!r}")
        self.job_id = job_id


class JobConflict(ValueError):
    """The job exists but cannot do what was asked in its current status.

    exports: the exports a delete would have to take with it (the caller may ask again with them).
    """

    def __init__(self, message: str, exports: list[str] | None = None) -> None:
        super().__init__(message)
        self.exports = exports


class QueueFull(RuntimeError):
    """As many jobs as `max_queued_jobs` wait already."""
