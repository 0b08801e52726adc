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

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationInfo, field_validator, model_validator

from tunestudio.chat_rows import BadTurn, read_tools
from tunestudio.config.vocabulary import PathText
from tunestudio.paths import PathRefused, Roots, expand

__all__ = ["IMPLEMENTED_TASKS", "MAKE_DATA_SECRET_FIELDS", "PROMPT_TASKS", "RECIPE_SUFFIX", "REJECTED_SUFFIX",
           "REPORT_SUFFIX", "Endpoint", "Gates", "Judge", "MakeDataConfig", "Recipe", "Teacher", "check_output",
           "confine", "read_tools_file", "recipe_file", "rejected_file", "report_file", "resolve", "with_key"]

# Each endpoint's key, by the field that holds it in a MakeDataConfig (filled from its `api_key_env`).
KEY_FIELDS = {"api_key": "teacher", "judge_api_key": "gates.judge", "rejected_api_key": "rejected_by"}
MAKE_DATA_SECRET_FIELDS = tuple(KEY_FIELDS)
IMPLEMENTED_TASKS = ("qa", "conversation", "answer", "preference", "tools")
PROMPT_TASKS = ("answer", "preference", "tools")  # their sources are seed prompts; qa and conversation's: documents
RECIPE_SUFFIX = ".recipe.json"  # beside the output: the recipe and the teacher's identity; the studio's mark
REPORT_SUFFIX = ".report.json"  # beside the output: rows per gate removed, with examples
REJECTED_SUFFIX = ".rejected.jsonl"  # beside the output: each row a gate removed and each failed call, as they come
MAX_TOOLS_BYTES = 1 << 20
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
Task = Literal["qa", "conversation", "answer", "preference", "tools"]


def _http_url(value: str | None) -> str | None:
    if value is not None and not value.startswith(("http://", "https://")):
        raise ValueError(f"{value!r} is not an http(s) address (e.g. http://127.0.0.1:8765/v1)")
    return value


def _env_name(value: str | None) -> str | None:
    if value is not None and not _ENV_NAME.fullmatch(value):
        raise ValueError(f"{value!r} is not an environment variable's name (the key goes in the variable, not in the "
                         "recipe)")
    return value


class Endpoint(BaseModel):
    """Any OpenAI-compatible /v1: a finished tunestudio job (`ID`, or `ID:base` for its base) through the studio's
    own /v1, llama.cpp, Ollama, a hosted API."""

    model_config = ConfigDict(extra="forbid")

    base_url: str = Field(min_length=1, max_length=2048, description="The endpoint's /v1 address.")
    model: str = Field(min_length=1, max_length=512, description="The model name the endpoint knows.")
    api_key_env: str | None = Field(default=None, description=(
        "The environment variable holding the key, if the endpoint wants one (the key itself is never written)."))

    _http = field_validator("base_url")(classmethod(lambda cls, value: _http_url(value)))
    _env = field_validator("api_key_env")(classmethod(lambda cls, value: _env_name(value)))

    def identity(self) -> dict[str, str]:
        return {"base_url": self.base_url, "model": self.model}


class Teacher(Endpoint):
    """The model that writes the rows."""

    temperature: float = Field(default=0.7, ge=0, le=2)
    max_tokens: int = Field(default=512, ge=1, le=32_768, description="Tokens the teacher may write per request.")


DEFAULT_RUBRIC = ("The answer is correct, answers what was asked, and is clear and complete without padding; a "
                  "tool call names the right function with the right arguments.")


class Judge(BaseModel):
    """The gates a model decides: a score against a rubric, and (qa, conversation) whether the answer is supported by
    its chunk; for `preference` without `rejected_by`, which of two answers is better. The endpoint defaults to the
    teacher's (base_url, model and key); name another to have a different model judge."""

    model_config = ConfigDict(extra="forbid")

    base_url: str | None = Field(default=None, max_length=2048, description="Default: the teacher's.")
    model: str | None = Field(default=None, max_length=512, description="Default: the teacher's.")
    api_key_env: str | None = Field(default=None, description="Default: the teacher's (when base_url is too).")
    rubric: str = Field(default=DEFAULT_RUBRIC, min_length=1, max_length=4000, description=(
        "What a good row is; the judge scores each row against it from 1 to 10."))
    min_score: int | None = Field(default=None, ge=1, le=10, description=(
        "Keep a row only if the judge scores it at least this (None: no score gate)."))
    grounding: bool = Field(default=False, description=(
        "qa and conversation: keep a row only if the judge finds every fact of its answers in its chunk."))
    max_tokens: int = Field(default=16, ge=1, le=4096, description="Tokens the judge may write per verdict.")

    _http = field_validator("base_url")(classmethod(lambda cls, value: _http_url(value)))
    _env = field_validator("api_key_env")(classmethod(lambda cls, value: _env_name(value)))

    def endpoint(self, teacher: Teacher) -> Endpoint:
        """Where the verdicts are asked: this judge's fields, the teacher's where it names none."""
        own = self.base_url is not None
        return Endpoint(base_url=self.base_url or teacher.base_url, model=self.model or teacher.model,
                        api_key_env=self.api_key_env if own or self.api_key_env else teacher.api_key_env)


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
    judge: Judge | None = Field(default=None, description=(
        "A model's verdicts as gates: min_score against a rubric, grounding in the chunk (default: none)."))

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
        "with prompt/question/messages, .csv with a prompt or question column, .txt one a line) for answer, "
        "preference and tools."))
    task: Task = Field(description=(
        "qa (a question and answer per chunk), conversation (turns about a chunk), answer (the teacher answers each "
        "prompt), preference (the teacher's answer chosen over rejected_by's, or two of its samples ranked by "
        "gates.judge), tools (each prompt asked with the `tools` file's functions: calls or an answer)."))
    rows: int = Field(ge=1, le=1_000_000, description="How many rows to make.")
    teacher: Teacher
    rejected_by: Endpoint | None = Field(default=None, description=(
        "preference: the weaker model whose answer is the rejected one (e.g. a job's base, ID:base, on the "
        "studio's /v1). Without it, the teacher answers twice and gates.judge picks the better."))
    tools: PathText | None = Field(default=None, validate_default=True, description=(
        "tools: a JSON file of the functions the teacher may call (OpenAI's tools list, or bare functions)."))
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
    gates: Gates = Field(default_factory=Gates, validate_default=True)
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Orders the chunks and seeds the requests.")
    preview_rows: int = Field(default=3, ge=1, le=100, description="Rows `--preview` makes and prints.")

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

    # Each task's own fields, given where it uses them and refused where it does not: field validators (each error
    # names its field), on fields declared after `task`, reading it from what is validated so far.
    @field_validator("rejected_by")
    @classmethod
    def _weaker_for_preference(cls, value: Endpoint | None, info: ValidationInfo) -> Endpoint | None:
        task = info.data.get("task")
        if value is not None and task is not None and task != "preference":
            raise ValueError(f"rejected_by is for the preference task, not {task!r}")
        return value

    @field_validator("tools")
    @classmethod
    def _tools_for_tools(cls, value: str | None, info: ValidationInfo) -> str | None:
        task = info.data.get("task")
        if task == "tools" and value is None:
            raise ValueError("the tools task needs `tools`: a JSON file of the functions the teacher may call")
        if value is not None and task is not None and task != "tools":
            raise ValueError(f"tools is for the tools task, not {task!r}")
        return value

    @field_validator("gates")
    @classmethod
    def _judge_for_task(cls, value: Gates, info: ValidationInfo) -> Gates:
        task, judge = info.data.get("task"), value.judge
        # the judge ranks preference's two answers when rejected_by is none (absent from info.data: it failed, and
        # its own error is said)
        ranks = task == "preference" and "rejected_by" in info.data and info.data["rejected_by"] is None
        if task == "preference" and judge is None and ranks:
            raise ValueError("preference needs rejected_by (a weaker model, whose answer is the rejected one) or "
                             "gates.judge (to rank two of the teacher's answers)")
        if judge is not None and judge.min_score is None and not judge.grounding and not ranks:
            raise ValueError("gates.judge gates nothing: set judge.min_score or judge.grounding (or, for the "
                             "preference task without rejected_by, let it rank the two answers)")
        if judge is not None and judge.grounding and task in PROMPT_TASKS:
            raise ValueError(f"judge.grounding checks answers against their document chunk; task {task!r} has no "
                             "chunk (its sources are prompts)")
        return value

    @property
    def budget(self) -> int:
        return self.max_requests if self.max_requests is not None else 3 * self.rows


class MakeDataConfig(Recipe):
    """A recipe as a job runs it: with the keys `with_key` read from each endpoint's api_key_env (never stored)."""

    api_key: SecretStr | None = Field(default=None, description="Filled from teacher.api_key_env; never stored.")
    judge_api_key: SecretStr | None = Field(default=None, description="Filled from the judge's api_key_env.")
    rejected_api_key: SecretStr | None = Field(default=None, description="Filled from rejected_by.api_key_env.")

    def public_dict(self) -> dict[str, Any]:
        """The recipe as JSON-ready data without the keys (safe to store or show)."""
        return self.model_dump(mode="json", exclude=set(MAKE_DATA_SECRET_FIELDS))

    def secrets(self) -> dict[str, str]:
        return {name: value.get_secret_value() for name in MAKE_DATA_SECRET_FIELDS
                if (value := getattr(self, name)) is not None}

    def endpoints(self) -> dict[str, Endpoint]:
        """The endpoints the run calls, by the field holding each one's key."""
        found: dict[str, Endpoint] = {"api_key": self.teacher}
        if self.gates.judge is not None:
            found["judge_api_key"] = self.gates.judge.endpoint(self.teacher)
        if self.rejected_by is not None:
            found["rejected_api_key"] = self.rejected_by
        return found

    @classmethod
    def from_parts(cls, public: dict[str, Any], secrets: dict[str, str] | None = None) -> MakeDataConfig:
        return cls.model_validate({**public, **(secrets or {})})


def with_key(cfg: MakeDataConfig, environ: Mapping[str, str] | None = None) -> MakeDataConfig:
    """The recipe with each endpoint's key read from its `api_key_env` (PathRefused, naming the field, when a named
    variable is unset)."""
    environ = os.environ if environ is None else environ
    keys: dict[str, SecretStr] = {}
    for field, endpoint in cfg.endpoints().items():
        name = endpoint.api_key_env
        if name is None or getattr(cfg, field) is not None:
            continue
        value = environ.get(name)
        if not value:
            raise PathRefused(f"{KEY_FIELDS[field]}.api_key_env", f"the environment variable {name} is not set (it "
                              f"should hold the key of {endpoint.base_url})", code="key_missing")
        keys[field] = SecretStr(value)
    return cfg.model_copy(update=keys) if keys else cfg


def read_tools_file(path: str | Path) -> list[dict[str, Any]]:
    """The functions of a tools file, in OpenAI's form (chat_rows.read_tools); ValueError says what is wrong."""
    path = Path(path)
    if path.stat().st_size > MAX_TOOLS_BYTES:
        raise ValueError(f"{path} is over {MAX_TOOLS_BYTES >> 20} MiB; a tools file is a JSON list of functions")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not JSON ({exc})") from None
    if isinstance(data, dict) and "tools" in data:
        data = data["tools"]
    try:
        tools = read_tools(data)
    except BadTurn as exc:
        raise ValueError(f"{path}: {exc}") from None
    if not tools:
        raise ValueError(f"{path} names no function")
    return tools


def recipe_file(output: str | Path) -> Path:
    return Path(f"{output}{RECIPE_SUFFIX}")


def rejected_file(output: str | Path) -> Path:
    return Path(f"{output}{REJECTED_SUFFIX}")


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
    tools = None
    if cfg.tools is not None:
        tools = str(expand(cfg.tools).resolve())
        if not Path(tools).is_file():
            raise PathRefused("tools", f"{cfg.tools} is not a file", code="path_missing")
        try:
            read_tools_file(tools)
        except (OSError, ValueError) as exc:
            raise PathRefused("tools", str(exc)) from None
    output = expand(cfg.output).resolve()
    if any(output == Path(s) or (output.is_relative_to(s) and Path(s).is_dir()) for s in sources):
        raise PathRefused("output", f"{cfg.output} is one of the sources, or inside one", also="sources")
    cfg = cfg.model_copy(update={"sources": sources, "output": str(output), "tools": tools,
                                 "gates": cfg.gates.model_copy(update={"against": against})})
    check_output(cfg)
    return cfg


def check_output(cfg: MakeDataConfig) -> None:
    """PathRefused unless the output file is new, or one the studio wrote (its recipe file beside it)."""
    output = Path(cfg.output)
    if output.is_dir():
        raise PathRefused("output", f"{output} is a folder; name the .jsonl file to write")
    if _ours(output):
        return
    for path in (output, recipe_file(output), report_file(output), rejected_file(output)):
        if path.exists() or path.is_symlink():
            raise PathRefused("output", f"{path} exists and tunestudio did not write it; choose a new file "
                                        "(tunestudio never overwrites a file it did not create)",
                              code="output_not_ours")


def _ours(output: Path) -> bool:
    try:
        return json.loads(recipe_file(output).read_text(encoding="utf-8")).get("made_by") == "tunestudio"
    except (OSError, ValueError, AttributeError):
        return False


def confine(cfg: Recipe, roots: Roots) -> None:
    """PathRefused unless every path lies inside the roots (paths only: a refusal tells nothing of what exists)."""
    readable = (roots.data_dir, *roots.dataset_roots, *roots.bundled)
    writable = (roots.data_dir, *roots.dataset_roots)
    for field, raws in (("sources", cfg.sources), ("gates.against", cfg.gates.against),
                        ("tools", [cfg.tools] if cfg.tools else [])):
        for raw in raws:
            if not _inside(raw, readable):
                raise PathRefused(field, f"{raw} must be inside one of {', '.join(map(str, readable))}")
    for field, raw in (("output", cfg.output), ("output_dir", cfg.output_dir)):
        if raw and not _inside(raw, writable, strictly=True):
            raise PathRefused(field, f"{raw} must be strictly inside one of {', '.join(map(str, writable))}")


def _inside(raw: str, roots: tuple[Path, ...], strictly: bool = False) -> bool:
    path = Path(os.path.abspath(expand(raw)))
    return any(path.is_relative_to(r) and not (strictly and path == r) for r in roots)
