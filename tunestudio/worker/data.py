"""Loading a job's dataset and turning it into what TRL's SFTTrainer trains on.

Every row becomes one of three TRL shapes:
- conversational prompt/completion ({"prompt": [msgs], "completion": [msgs]}):
  alpaca, and custom mappings with a single assistant column, so the
  completion mask works with any chat template;
- conversational messages ({"messages": [...]}): sharegpt and OpenAI messages;
- plain prompt/completion strings, or plain {"text"}.

Errors a user can cause name the file and the row (1-based, as an editor shows it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datasets import Dataset

from tunestudio.config import JobConfig
from tunestudio.worker.errors import UserError

SUPPORTED_SUFFIXES = (".json", ".jsonl")
_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                   "system": "system", "bot": "assistant", "model": "assistant"}


@dataclass
class Row:
    source: str
    number: int  # 1-based line (JSONL) or list index + 1 (JSON)
    data: dict[str, Any]

    def where(self) -> str:
        return f"dataset {self.source} row {self.number}"


@dataclass
class PreparedData:
    train: Dataset
    eval: Dataset | None
    format_type: str
    notes: list[str] = field(default_factory=list)  # what the user should be told, as log lines
    warnings: list[str] = field(default_factory=list)


# --- reading --------------------------------------------------------------------
def _files(path: Path) -> list[Path]:
    if path.is_dir():
        found = sorted(p for p in path.rglob("*") if p.suffix.lower() in SUPPORTED_SUFFIXES and p.is_file())
        if not found:
            raise UserError(f"dataset folder {path} holds no {' or '.join(SUPPORTED_SUFFIXES)} files")
        return found
    if path.suffix.lower() not in SUPPORTED_SUFFIXES:
        raise UserError(f"dataset {path}: unsupported file type {path.suffix!r}; use {', '.join(SUPPORTED_SUFFIXES)}")
    return [path]


def _read_text(path: Path) -> str:
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise UserError(f"dataset {path} row {line} is not valid UTF-8 (byte offset {exc.start})") from None


def read_file(path: Path) -> list[Row]:
    text = _read_text(path)
    rows: list[Row] = []
    if path.suffix.lower() == ".jsonl":
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"dataset {path} row {number} is not valid JSON: {exc.msg}") from None
            if not isinstance(item, dict):
                raise UserError(f"dataset {path} row {number} is a {type(item).__name__}, not an object")
            rows.append(Row(str(path), number, item))
        return rows
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"dataset {path} is not valid JSON (line {exc.lineno}): {exc.msg}") from None
    if isinstance(data, dict):
        # {"train": [...]} or {"data": [...]}: one list of rows inside an object.
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(lists) != 1:
            raise UserError(f"dataset {path} is a JSON object; expected a list of rows or an object holding one list")
        data = lists[0]
    if not isinstance(data, list):
        raise UserError(f"dataset {path} must be a JSON list of rows")
    for number, item in enumerate(data, start=1):
        if not isinstance(item, dict):
            raise UserError(f"dataset {path} row {number} is a {type(item).__name__}, not an object")
        rows.append(Row(str(path), number, item))
    return rows


def read_local(paths: list[str]) -> list[Row]:
    rows: list[Row] = []
    for raw in paths:
        for file in _files(Path(raw)):
            rows.extend(read_file(file))
    if not rows:
        raise UserError(f"dataset {', '.join(paths)} is empty: no rows to train on")
    return rows


# --- formats --------------------------------------------------------------------
def detect_format(columns: set[str]) -> str | None:
    if {"instruction", "output"} <= columns:
        return "alpaca"
    if "conversations" in columns:
        return "sharegpt"
    if "messages" in columns:
        return "messages"
    if {"prompt", "completion"} <= columns:
        return "prompt_completion"
    if "text" in columns:
        return "text"
    return None


def _need(row: Row, *names: str) -> None:
    missing = [n for n in names if n not in row.data or row.data[n] is None]
    if missing:
        raise UserError(
            f"{row.where()} has no {', '.join(repr(m) for m in missing)} field; "
            "set format_type or custom_format_mapping to match your columns"
        )


def _alpaca(row: Row) -> dict[str, Any]:
    _need(row, "instruction", "output")
    user = str(row.data["instruction"])
    if row.data.get("input"):
        user = f"{user}\n\n{row.data['input']}"
    prompt = [{"role": "user", "content": user}]
    if row.data.get("system"):
        prompt.insert(0, {"role": "system", "content": str(row.data["system"])})
    return {"prompt": prompt, "completion": [{"role": "assistant", "content": str(row.data["output"])}]}


def _turns(row: Row, key: str, role_key: str, content_key: str) -> dict[str, Any]:
    _need(row, key)
    turns = row.data[key]
    if not isinstance(turns, list) or not turns:
        raise UserError(f"{row.where()}: {key!r} must be a non-empty list of turns")
    messages = []
    for i, turn in enumerate(turns, start=1):
        if not isinstance(turn, dict) or role_key not in turn or content_key not in turn:
            raise UserError(f"{row.where()}: turn {i} of {key!r} needs {role_key!r} and {content_key!r}")
        role = _SHAREGPT_ROLES.get(str(turn[role_key]).lower())
        if role is None:
            raise UserError(f"{row.where()}: turn {i} has unknown role {turn[role_key]!r}")
        messages.append({"role": role, "content": str(turn[content_key])})
    if not any(m["role"] == "assistant" for m in messages):
        raise UserError(f"{row.where()}: the conversation has no assistant turn to learn from")
    return {"messages": messages}


def _sharegpt(row: Row) -> dict[str, Any]:
    return _turns(row, "conversations", "from", "value")


def _messages(row: Row) -> dict[str, Any]:
    return _turns(row, "messages", "role", "content")


def _prompt_completion(row: Row) -> dict[str, Any]:
    _need(row, "prompt", "completion")
    return {"prompt": str(row.data["prompt"]), "completion": str(row.data["completion"])}


def _text(row: Row) -> dict[str, Any]:
    _need(row, "text")
    return {"text": str(row.data["text"])}


def _custom(mapping: dict[str, str]) -> Callable[[Row], dict[str, Any]]:
    def convert(row: Row) -> dict[str, Any]:
        _need(row, *mapping)
        messages = [{"role": role, "content": str(row.data[col])} for col, role in mapping.items()]
        if list(mapping.values()).count("assistant") == 1 and messages[-1]["role"] == "assistant":
            return {"prompt": messages[:-1], "completion": messages[-1:]}
        return {"messages": messages}

    return convert


CONVERTERS: dict[str, Callable[[Row], dict[str, Any]]] = {
    "alpaca": _alpaca,
    "sharegpt": _sharegpt,
    "messages": _messages,
    "prompt_completion": _prompt_completion,
    "text": _text,
}


def resolve_format(cfg: JobConfig, rows: list[Row]) -> tuple[str, Callable[[Row], dict[str, Any]]]:
    if cfg.custom_format_mapping:
        return "custom", _custom(cfg.custom_format_mapping)
    if cfg.format_type != "auto":
        return cfg.format_type, CONVERTERS[cfg.format_type]
    columns = set(rows[0].data)
    found = detect_format(columns)
    if found is None:
        raise UserError(
            f"{rows[0].where()}: cannot tell the dataset's format from its columns "
            f"{sorted(columns)}; set format_type (alpaca, sharegpt, messages, prompt_completion, text) "
            "or custom_format_mapping, e.g. {\"question\": \"user\", \"answer\": \"assistant\"}"
        )
    return found, CONVERTERS[found]


# --- slicing and splitting ------------------------------------------------------
def slice_rows(rows: list[Any], start: int | None, end: int | None) -> list[Any]:
    """Rows start..end, both inclusive, clamped to the dataset's range."""
    if not rows:
        return rows
    first = min(max(start or 0, 0), len(rows) - 1)
    last = len(rows) - 1 if end is None else min(max(end, first), len(rows) - 1)
    return rows[first : last + 1]


def auto_eval_size(n_rows: int) -> int:
    """5% of the rows, clamped to 16..128; 0 when the dataset has under 32 rows."""
    if n_rows < 32:
        return 0
    return min(max(math.ceil(n_rows * 0.05), 16), 128)


def prepare(cfg: JobConfig) -> PreparedData:
    """Read, convert, slice and split the job's dataset."""
    if cfg.hf_dataset:
        raise UserError("hf_dataset: hub datasets are not supported yet; use local_datasets")
    rows = read_local(cfg.local_datasets)
    rows = slice_rows(rows, cfg.dataset_slice_start, cfg.dataset_slice_end)
    fmt, convert = resolve_format(cfg, rows)
    examples = [convert(r) for r in rows]

    notes = [f"dataset: {len(rows)} rows read as {fmt}"
             + (" (auto-detected)" if cfg.format_type == "auto" and fmt != "custom" else "")]
    warnings: list[str] = []
    eval_examples: list[dict[str, Any]] = []
    if cfg.eval_steps > 0:
        n_eval = auto_eval_size(len(examples))
        if n_eval:
            # Deterministic hold-out from the job's seed, so a resumed job sees the same split.
            import random

            order = list(range(len(examples)))
            random.Random(cfg.random_seed).shuffle(order)
            held = set(order[:n_eval])
            eval_examples = [e for i, e in enumerate(examples) if i in held]
            examples = [e for i, e in enumerate(examples) if i not in held]
            notes.append(f"eval: held out {n_eval} rows for evaluation")
        else:
            warnings.append(f"eval_steps is set but the dataset has only {len(examples)} rows (<32); no eval")
    return PreparedData(
        train=Dataset.from_list(examples),
        eval=Dataset.from_list(eval_examples) if eval_examples else None,
        format_type=fmt,
        notes=notes,
        warnings=warnings,
    )
