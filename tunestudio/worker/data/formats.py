"""Telling a dataset's format from its columns, and turning each row into a TRL shape.

- alpaca and custom mappings with one final assistant column become
  conversational prompt/completion ({"prompt": [msgs], "completion": [msgs]}),
  so the completion mask works with any chat template;
- sharegpt and OpenAI messages become {"messages": [...]};
- prompt/completion strings stay plain strings, and text stays {"text"}.

A row that cannot be converted raises `RowProblem`; the caller drops and counts it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tunestudio.config import JobConfig
from tunestudio.worker.data.sources import Row
from tunestudio.worker.errors import UserError

Converter = Callable[[dict[str, Any]], dict[str, Any]]

# The columns that identify each structured format; `text` is the fallback.
SIGNATURES: dict[str, set[str]] = {
    "alpaca": {"instruction", "output"},
    "sharegpt": {"conversations"},
    "messages": {"messages"},
    "prompt_completion": {"prompt", "completion"},
}
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system",
          "bot": "assistant", "model": "assistant", "chatgpt": "assistant"}
_HOW_TO_SET = ("set format_type (alpaca, sharegpt, messages, prompt_completion, text) or custom_format_mapping, "
               'e.g. {"question": "user", "answer": "assistant"}')


class RowProblem(Exception):
    """One row cannot be used; the message completes "dataset F row N ..."."""


def candidates(columns: set[str]) -> list[str]:
    found = [name for name, needed in SIGNATURES.items() if needed <= columns]
    if not found and "text" in columns:
        found = ["text"]
    return found


def detect_format(rows: list[Row]) -> str:
    """The one format the first readable row's columns fit; UserError if none or several do."""
    first = next((r for r in rows if r.data is not None), None)
    if first is None:
        raise UserError(f"{rows[0].where()}: no row of the dataset could be read ({rows[0].problem})")
    columns = set(first.data or {})
    found = candidates(columns)
    if len(found) == 1:
        return found[0]
    what = "is ambiguous: it fits " + " and ".join(found) if found else "is not a format tunestudio knows"
    raise UserError(f"dataset {first.source}: the format {what}; the columns found are {sorted(columns)}; "
                    f"{_HOW_TO_SET}")


def _text(data: dict[str, Any], name: str, *, required: bool = True) -> str:
    value = data.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            raise RowProblem(f"has no {name!r} field (or it is empty); {_HOW_TO_SET} to match your columns")
        return ""
    if isinstance(value, (dict, list)):
        raise RowProblem(f"field {name!r} is a {type(value).__name__}, not text")
    return str(value)


def _alpaca(data: dict[str, Any]) -> dict[str, Any]:
    user = _text(data, "instruction")
    output = _text(data, "output")
    extra = _text(data, "input", required=False)
    if extra:
        user = f"{user}\n\n{extra}"
    prompt = [{"role": "user", "content": user}]
    system = _text(data, "system", required=False)
    if system:
        prompt.insert(0, {"role": "system", "content": system})
    return {"prompt": prompt, "completion": [{"role": "assistant", "content": output}]}


def _turns(data: dict[str, Any], key: str) -> dict[str, Any]:
    """A conversation; each turn is from/value (sharegpt) or role/content (OpenAI), whichever the row uses."""
    turns = data.get(key)
    if not isinstance(turns, list) or not turns:
        raise RowProblem(f"has no {key!r} list of turns; {_HOW_TO_SET} to match your columns")
    messages = []
    for i, turn in enumerate(turns, start=1):
        if not isinstance(turn, dict):
            raise RowProblem(f"turn {i} of {key!r} is not an object")
        role = turn.get("from", turn.get("role"))
        content = turn.get("value", turn.get("content"))
        if role is None or not isinstance(content, str):
            raise RowProblem(f"turn {i} of {key!r} needs from/value or role/content text")
        mapped = _ROLES.get(str(role).strip().lower())
        if mapped is None:
            raise RowProblem(f"turn {i} has unknown role {role!r}")
        messages.append({"role": mapped, "content": content})
    if not any(m["role"] == "assistant" for m in messages):
        raise RowProblem("has no assistant turn to learn from")
    return {"messages": messages}


def _prompt_completion(data: dict[str, Any]) -> dict[str, Any]:
    return {"prompt": _text(data, "prompt"), "completion": _text(data, "completion")}


def _custom(mapping: dict[str, str]) -> Converter:
    single_answer = list(mapping.values()).count("assistant") == 1 and list(mapping.values())[-1] == "assistant"

    def convert(data: dict[str, Any]) -> dict[str, Any]:
        messages = [{"role": role, "content": _text(data, column)} for column, role in mapping.items()]
        if single_answer:
            return {"prompt": messages[:-1], "completion": messages[-1:]}
        return {"messages": messages}

    return convert


CONVERTERS: dict[str, Converter] = {
    "alpaca": _alpaca,
    "sharegpt": lambda data: _turns(data, "conversations"),
    "messages": lambda data: _turns(data, "messages"),
    "prompt_completion": _prompt_completion,
    "text": lambda data: {"text": _text(data, "text")},
}


def resolve_format(cfg: JobConfig, rows: list[Row]) -> tuple[str, Converter, bool]:
    """The format's name, its converter, and whether it was auto-detected."""
    if cfg.method != "sft":  # preference, unpaired, prompt-only and plain-text formats
        from tunestudio.worker.data import method_formats

        return method_formats.resolve(cfg, rows)
    if cfg.custom_format_mapping:
        return "custom", _custom(cfg.custom_format_mapping), False
    if cfg.format_type != "auto":
        return cfg.format_type, CONVERTERS[cfg.format_type], False
    sources = {}
    for row in rows:
        sources.setdefault(row.source, []).append(row)
    found = {source: detect_format(part) for source, part in sources.items()}
    if len(set(found.values())) > 1:
        listed = "; ".join(f"{source}: {fmt}" for source, fmt in found.items())
        raise UserError(f"the dataset files are in different formats ({listed}); train on one format at a time")
    fmt = next(iter(found.values()))
    return fmt, CONVERTERS[fmt], True
