"""`BenchConfig`: one benchmark run of a finished job through lm-evaluation-harness. Pure data, no I/O.

A benchmark is a job of kind "bench" (source_job: the job it measures). Its worker (worker/bench.py) runs the
harness against this studio's own `/v1` for the job's base model (`<id>:base`, "before") and for the job
("after"), so what is measured is what the studio serves: generation tasks with the chat template through its
`local-chat-completions` model and `/v1/chat/completions` (`chat_url`), loglikelihood tasks (and every task
without the template) through `local-completions` and `/v1/completions` (`base_url`). Tasks are
the harness's standard tasks whose data is in the local HF datasets cache, and the user's own eval file as a
custom task (`eval_file`: JSON lines of `question`, `choices`, `answer` for multiple choice, or `question`,
`answer` for generation scored by exact match), written as harness task YAML by the worker.

The server's token is a secret: never part of `public_dict()`, handed to the worker through its secrets.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from tunestudio.config.vocabulary import PathText

__all__ = ["BENCH_SECRET_FIELDS", "BenchConfig", "BenchOptions"]

BENCH_SECRET_FIELDS = ("api_token",)
_TASK = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")


class BenchOptions(BaseModel):
    """What a user asks for (the API's request body, the CLI's options)."""

    model_config = ConfigDict(extra="forbid")

    tasks: list[str] = Field(default_factory=list, max_length=32,
                             description="lm-evaluation-harness task or group names (their data must be cached).")
    eval_file: PathText | None = Field(default=None, max_length=4096, description=(
        "A JSON lines file of your own, run as a task: rows {question, choices, answer} (multiple choice; answer "
        "the right choice's index or text) or {question, answer} (generation, exact match)."))
    limit: int | None = Field(default=None, ge=1, le=1_000_000, description="At most this many rows per task.")
    chat_template: bool | None = Field(default=None, description=(
        "Wrap each prompt in the job's chat template; default: when its tokenizer has one (as it trained)."))

    @field_validator("tasks")
    @classmethod
    def _task_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not _TASK.fullmatch(name):
                raise ValueError(f"{name!r} is not a task name (letters, digits, '_', '.', '-')")
        if len(set(value)) != len(value):
            raise ValueError("a task is named twice")
        return value

    @model_validator(mode="after")
    def _something(self) -> BenchOptions:
        if not self.tasks and not self.eval_file:
            raise ValueError("name at least one task (tasks) or give an eval_file")
        return self


class BenchConfig(BenchOptions):
    """The options plus what the manager fills in: the job measured, its models and the server to ask."""

    source_job_id: str = Field(min_length=1)
    base_url: str = Field(min_length=1, description="The studio's /v1/completions the harness calls.")
    chat_url: str | None = Field(default=None, min_length=1, description=(
        "The studio's /v1/chat/completions the harness calls for generation tasks; none (a config written before "
        "there was one): they go to base_url with the template rendered by the harness."))
    tokenizer: str = Field(min_length=1, description="The job's tokenizer folder (the harness's tokenizer).")
    base_model: str | None = Field(default=None, description="The job's base model (its context length).")
    models: dict[str, str] = Field(description='{"before": "<id>:base", "after": "<id>"}: the models compared.')
    output_dir: PathText | None = None
    api_token: SecretStr | None = None

    def public_dict(self) -> dict[str, Any]:
        """The config as JSON-ready data without the token (safe to store or show)."""
        return self.model_dump(mode="json", exclude=set(BENCH_SECRET_FIELDS))

    def secrets(self) -> dict[str, str]:
        return {"api_token": self.api_token.get_secret_value()} if self.api_token is not None else {}

    @classmethod
    def from_parts(cls, public: dict[str, Any], secrets: dict[str, str] | None = None) -> BenchConfig:
        return cls.model_validate({**public, **(secrets or {})})
