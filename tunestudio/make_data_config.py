"""`MakeDataConfig`: a data-making recipe (issue 43). Pure data, validated before anything runs.

A recipe names its sources (documents, or seed prompts for `answer`), the task, how many rows, the teacher (any
OpenAI-compatible endpoint) and the JSONL file to write; everything else has a default. A job of kind
"make_data" runs it in a worker (tunestudio/worker/make_data/): documents are converted there, so a broken PDF
fails the job, not the server.

The teacher's key is a secret: the recipe names the environment variable that holds it (`teacher.api_key_env`);
the face that submits reads it (`with_key`) into `api_key`, which travels to the worker through the secrets
channel and is never stored, logged or shown (`public_dict` leaves it out).

`resolve` and `confine` are the explicit path steps (validators never touch the filesystem), as
tunestudio/paths.py does for a training job; `check_output` applies the ownership rule to the output file: a
file the studio did not write is never overwritten, one it wrote (its `.recipe.json` beside it) is appended to.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from tunestudio.config.vocabulary import PathText
from tunestudio.paths import PathRefused, Roots, expand

__all__ = ["IMPLEMENTED_TASKS", "MAKE_DATA_SECRET_FIELDS", "RECIPE_SUFFIX", "REPORT_SUFFIX", "Gates",
           "MakeDataConfig", "Recipe", "Teacher", "check_output", "confine", "recipe_file", "report_file", "resolve",
           "with_key"]

MAKE_DATA_SECRET_FIELDS = ("api_key",)
IMPLEMENTED_TASKS = ("qa", "conversation", "answer")
RECIPE_SUFFIX = ".recipe.json"  # beside the output: the recipe and the teacher's identity; the studio's mark
REPORT_SUFFIX = ".report.json"  # beside the output: rows per gate removed, with examples
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
Task = Literal["qa", "conversation", "answer", "preference", "tools"]


class Teacher(BaseModel):
    """The model that writes the rows: any OpenAI-compatible /v1 (a finished tunestudio job, llama.cpp, a hosted
    API)."""

    model_config = ConfigDict(extra="forbid")

    base_url: str = Field(min_length=1, max_length=2048, description="The endpoint's /v1 address.")
    model: str = Field(min_length=1, max_length=512, description="The model name the endpoint knows.")
    api_key_env: str | None = Field(default=None, description=(
        "The environment variable holding the key, if the endpoint wants one (the key itself is never written)."))
    temperature: float = Field(default=0.7, ge=0, le=2)
    max_tokens: int = Field(default=512, ge=1, le=32_768, description="Tokens the teacher may write per request.")

    @field_validator("base_url")
    @classmethod
    def _http(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"{value!r} is not an http(s) address (e.g. http://127.0.0.1:8765/v1)")
        return value

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and not _ENV_NAME.fullmatch(value):
            raise ValueError(f"{value!r} is not an environment variable's name (the key goes in the variable, "
                             "not in the recipe)")
        return value


class Gates(BaseModel):
    """What a row must pass to be kept; the report counts what each removed."""

    model_config = ConfigDict(extra="forbid")

    min_answer_chars: int = Field(default=20, ge=0, le=1_000_000)
    max_answer_chars: int = Field(default=4000, ge=1, le=1_000_000)
    min_question_chars: int = Field(default=8, ge=0, le=1_000_000)
    dedupe: Literal["off", "exact", "near"] = Field(default="near", description=(
        "Remove a row whose question and answer repeat a kept row's (exact: after normalising case and spacing; "
        "near: word 3-gram Jaccard similarity at least near_threshold) or a row of the `against` files."))
    near_threshold: float = Field(default=0.8, gt=0, le=1)
    against: list[PathText] = Field(default_factory=list, max_length=64, description=(
        "JSONL files (held-out or benchmark rows) the made rows must not duplicate."))

    @model_validator(mode="after")
    def _bounds(self) -> Gates:
        if self.min_answer_chars > self.max_answer_chars:
            raise ValueError("min_answer_chars is above max_answer_chars")
        return self


class Recipe(BaseModel):
    """One data-making run as a user writes it (a YAML file, the API's body): sources → teacher → gates → rows
    appended to `output`. No key: the API takes this, so a key can never arrive in a request."""

    model_config = ConfigDict(extra="forbid")

    sources: list[PathText] = Field(min_length=1, max_length=1024, description=(
        "Files or folders: documents (.txt .md .html .pdf .docx) for qa and conversation; seed prompts (.jsonl "
        "with prompt/question/messages, .csv with a prompt or question column, .txt one a line) for answer."))
    task: Task = Field(description="qa, conversation or answer (preference and tools: not yet).")
    rows: int = Field(ge=1, le=1_000_000, description="How many rows to make.")
    teacher: Teacher
    output: PathText = Field(min_length=1, description="The JSONL file of messages rows to write (or append to).")
    output_dir: PathText | None = Field(default=None, description="The job's own folder (default: under jobs/).")
    chunk_size: int = Field(default=2000, ge=200, le=100_000, description="Characters per document chunk.")
    chunk_overlap: int = Field(default=200, ge=0, le=50_000, description="Characters two chunks share.")
    turns: int = Field(default=2, ge=1, le=8, description="conversation: the user's turns.")
    concurrency: int = Field(default=4, ge=1, le=64, description="Requests in flight at once.")
    max_requests: int | None = Field(default=None, ge=1, le=10_000_000, description=(
        "The budget: at most this many teacher calls (default: three per row asked)."))
    timeout: float = Field(default=120.0, gt=0, le=3600, description="Seconds a call may take, retries included.")
    retries: int = Field(default=4, ge=0, le=20, description="Tries after the first on 429, 5xx or no connection.")
    gates: Gates = Field(default_factory=Gates)
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Orders the chunks and seeds the requests.")
    preview_rows: int = Field(default=3, ge=1, le=100, description="Rows `--preview` makes and prints.")

    @field_validator("task")
    @classmethod
    def _implemented(cls, value: str) -> str:
        if value not in IMPLEMENTED_TASKS:
            raise ValueError(f"task {value!r} is not yet supported; the tasks made today are "
                             f"{', '.join(IMPLEMENTED_TASKS)}")
        return value

    @field_validator("output")
    @classmethod
    def _jsonl(cls, value: str) -> str:
        if not value.endswith(".jsonl"):
            raise ValueError(f"{value!r}: the output is a JSON lines file (.jsonl)")
        return value

    @model_validator(mode="after")
    def _overlap(self) -> Self:
        if self.chunk_overlap >= self.chunk_size:
            raise ValueError(f"chunk_overlap ({self.chunk_overlap}) must be below chunk_size ({self.chunk_size})")
        return self

    @property
    def budget(self) -> int:
        return self.max_requests if self.max_requests is not None else 3 * self.rows


class MakeDataConfig(Recipe):
    """A recipe as a job runs it: with the key `with_key` read from teacher.api_key_env (never stored)."""

    api_key: SecretStr | None = Field(default=None, description="Filled from teacher.api_key_env; never stored.")

    def public_dict(self) -> dict[str, Any]:
        """The recipe as JSON-ready data without the key (safe to store or show)."""
        return self.model_dump(mode="json", exclude=set(MAKE_DATA_SECRET_FIELDS))

    def secrets(self) -> dict[str, str]:
        return {"api_key": self.api_key.get_secret_value()} if self.api_key is not None else {}

    @classmethod
    def from_parts(cls, public: dict[str, Any], secrets: dict[str, str] | None = None) -> MakeDataConfig:
        return cls.model_validate({**public, **(secrets or {})})


def with_key(cfg: MakeDataConfig, environ: Mapping[str, str] | None = None) -> MakeDataConfig:
    """The recipe with its key read from `teacher.api_key_env` (PathRefused-like ValueError when it is unset)."""
    name = cfg.teacher.api_key_env
    if name is None or cfg.api_key is not None:
        return cfg
    value = (os.environ if environ is None else environ).get(name)
    if not value:
        raise PathRefused("teacher.api_key_env", f"the environment variable {name} is not set (it should hold the "
                                                 "teacher's key)", code="key_missing")
    return cfg.model_copy(update={"api_key": SecretStr(value)})


def recipe_file(output: str | Path) -> Path:
    return Path(f"{output}{RECIPE_SUFFIX}")


def report_file(output: str | Path) -> Path:
    return Path(f"{output}{REPORT_SUFFIX}")


def resolve(cfg: MakeDataConfig) -> MakeDataConfig:
    """Paths made absolute; every source and `against` file must exist, and the output may be written."""
    sources = [str(expand(s).resolve()) for s in cfg.sources]
    for raw, path in zip(cfg.sources, sources, strict=True):
        if not Path(path).exists():
            raise PathRefused("sources", f"{raw} does not exist", code="path_missing")
    against = [str(expand(a).resolve()) for a in cfg.gates.against]
    for raw, path in zip(cfg.gates.against, against, strict=True):
        if not Path(path).is_file():
            raise PathRefused("gates.against", f"{raw} is not a file", code="path_missing")
    output = expand(cfg.output).resolve()
    if any(output == Path(s) or (output.is_relative_to(s) and Path(s).is_dir()) for s in sources):
        raise PathRefused("output", f"{cfg.output} is one of the sources, or inside one", also="sources")
    cfg = cfg.model_copy(update={"sources": sources, "output": str(output),
                                 "gates": cfg.gates.model_copy(update={"against": against})})
    check_output(cfg)
    return cfg


def check_output(cfg: MakeDataConfig) -> None:
    """PathRefused unless the output file is new, or one the studio wrote (its recipe file beside it)."""
    output = Path(cfg.output)
    if output.is_dir():
        raise PathRefused("output", f"{output} is a folder; name the .jsonl file to write")
    if output.exists() and not _ours(output):
        raise PathRefused("output", f"{output} exists and tunestudio did not write it; choose a new file (tunestudio "
                                    "never overwrites a file it did not create)", code="output_not_ours")


def _ours(output: Path) -> bool:
    try:
        return json.loads(recipe_file(output).read_text(encoding="utf-8")).get("made_by") == "tunestudio"
    except (OSError, ValueError, AttributeError):
        return False


def confine(cfg: Recipe, roots: Roots) -> None:
    """PathRefused unless every path lies inside the roots (paths only: a refusal tells nothing of what exists)."""
    readable = (roots.data_dir, *roots.dataset_roots, *roots.bundled)
    writable = (roots.data_dir, *roots.dataset_roots)
    for field, raws in (("sources", cfg.sources), ("gates.against", cfg.gates.against)):
        for raw in raws:
            if not _inside(raw, readable):
                raise PathRefused(field, f"{raw} must be inside one of {', '.join(map(str, readable))}")
    for field, raw in (("output", cfg.output), ("output_dir", cfg.output_dir)):
        if raw and not _inside(raw, writable, strictly=True):
            raise PathRefused(field, f"{raw} must be strictly inside one of {', '.join(map(str, writable))}")


def _inside(raw: str, roots: tuple[Path, ...], strictly: bool = False) -> bool:
    path = Path(os.path.abspath(expand(raw)))
    return any(path.is_relative_to(r) and not (strictly and path == r) for r in roots)
