"""What the manager hands out: plain data about a job and its events."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from tunestudio.jobs.status import RESUMABLE, JobStatus


class Job(BaseModel):
    id: str
    status: JobStatus
    phase: str | None = None
    message: str = ""
    error: str | None = None
    config: dict[str, Any]
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    output_dir: str | None = None
    checkpoint: str | None = None
    resumed_from: str | None = None
    request_id: str | None = None
    final_metrics: dict[str, Any] | None = None
    progress: dict[str, Any] | None = None
    log_path: str | None = None
    last_seq: int = 0

    @property
    def resumable(self) -> bool:
        return self.status in RESUMABLE and self.checkpoint is not None and Path(self.checkpoint).is_dir()

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Job:
        fields = {k: row.get(k) for k in cls.model_fields}
        fields["message"] = fields["message"] or ""
        fields["last_seq"] = fields["last_seq"] or 0
        return cls.model_validate(fields)


@dataclass(frozen=True)
class JobEvent:
    """One event of a job's stream, numbered by the manager (seq is per job, from 1).

    It travels as JSON text (stored, streamed as is); `data` parses it on first use.
    """

    seq: int
    kind: str
    text: str

    @classmethod
    def of(cls, seq: int, kind: str, data: dict[str, Any]) -> JobEvent:
        return cls(seq, kind, json.dumps(data))

    @cached_property
    def data(self) -> dict[str, Any]:
        return json.loads(self.text)

    def json(self) -> str:
        return self.text

    @property
    def is_end(self) -> bool:
        """The last event of a job's stream: its final status."""
        return self.kind == "status" and JobStatus(self.data["status"]).is_terminal


class JobNotFound(LookupError):
    def __init__(self, job_id: str) -> None:
        super().__init__(f"no job {job_id!r}")
        self.job_id = job_id


class JobConflict(ValueError):
    """The job exists but cannot do what was asked in its current status."""
