"""Telling a dataset's format from its columns, and turning each row into a TRL shape.

- alpaca and custom mappings with one final assistant column become
  conversational prompt/completion ({"prompt": [msgs], "completion": [msgs]}),
  so the completion mask works with any chat template;
- sharegpt and OpenAI messages become {"messages": [...]} in OpenAI's form, with
  the row's "tools" when it has any (tool calls, tool results and reasoning:
  tunestudio/chat_rows.py);
- prompt/completion strings stay plain strings, and text stays {"text"}.

Fields and conversations are read by worker/data/conversations.py, as for the
other methods' formats (worker/data/method_formats.py, which `resolve_format`
hands every method but sft). A row that cannot be converted raises
`RowProblem`; the caller drops and counts it.
"""

from __future__ import annotations

from typing import Any

from tunestudio.config import DataSpec, JobConfig
from tunestudio.worker.data.conversations import (
    HOW_TO_SET,
    Converter,
    RowProblem,
    check_calls,
    conversation,
    text,
    tools,
)
from tunestudio.worker.data.rows import Row, Stream, firsts
from tunestudio.worker.errors import UserError

__all__ = ["CONVERTERS", "SIGNATURES", "Converter", "RowProblem", "candidates", "detect_format", "resolve_format"]

# The columns that identify each structured format; `text` is the fallback.
SIGNATURES: dict[str, set[str]] = {
    "alpaca": {"instruction", "output"},
    "sharegpt": {"conversations"},
    "messages": {"messages"},
    "prompt_completion": {"prompt", "completion"},
}


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
                    f"{_other_method(columns) if not found else ''}{HOW_TO_SET}")


def _other_method(columns: set[str]) -> str:
    """What to choose when the columns are another training method's format (a preference file given to SFT)."""
    from tunestudio.config import METHOD_FORMATS, METHOD_SPECS
    from tunestudio.worker.data.method_formats import SIGNATURES as METHOD_SIGNATURES

    fitting = [fmt for fmt, needed in METHOD_SIGNATURES.items() if needed <= columns and fmt not in CONVERTERS]
    if not fitting:
        return ""
    fmt = max(fitting, key=lambda f: len(METHOD_SIGNATURES[f]))  # the most specific: preference over prompt_only
    methods = [name for name, formats in METHOD_FORMATS.items() if fmt in formats and name != "sft"]
    labels = [METHOD_SPECS[name].label for name in methods]
    verb = "trains" if len(labels) == 1 else "train"
    return (f"they are the {fmt} format, which {_either(labels, 'and')} {verb} on: choose "
            f"{'one of those' if len(methods) > 1 else 'it'} as the training method "
            f"(method: {_either(methods, 'or')}); or ")


def _either(items: list[str], word: str) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} {word} {items[-1]}"


def _alpaca(data: dict[str, Any]) -> dict[str, Any]:
    user = text(data, "instruction")
    output = text(data, "output")
    extra = text(data, "input", required=False)
    if extra:
        user = f"{user}\n\n{extra}"
    prompt = [{"role": "user", "content": user}]
    system = text(data, "system", required=False)
    if system:
        prompt.insert(0, {"role": "system", "content": system})
    return {"prompt": prompt, "completion": [{"role": "assistant", "content": output}]}


def _turns(data: dict[str, Any], key: str) -> dict[str, Any]:
    """A conversation to learn from: it needs an assistant turn."""
    turns = data.get(key)
    if not isinstance(turns, list) or not turns:
        raise RowProblem(f"has no {key!r} list of turns; {HOW_TO_SET} to match your columns")
    messages = conversation(turns, key)
    if not any(m["role"] == "assistant" for m in messages):
        raise RowProblem("has no assistant turn to learn from")
    if not any(m["role"] == "assistant" and m.get("weight", 1) for m in messages):
        raise RowProblem("has no assistant turn to learn from: every one has weight 0")
    declared = tools(data)
    check_calls(messages, declared)
    return {"messages": messages, **({"tools": declared} if declared else {})}


def _prompt_completion(data: dict[str, Any]) -> dict[str, Any]:
    return {"prompt": text(data, "prompt"), "completion": text(data, "completion")}


def _custom(mapping: dict[str, str]) -> Converter:
    single_answer = list(mapping.values()).count("assistant") == 1 and list(mapping.values())[-1] == "assistant"

    def convert(data: dict[str, Any]) -> dict[str, Any]:
        messages = [{"role": role, "content": text(data, column)} for column, role in mapping.items()]
        if single_answer:
            return {"prompt": messages[:-1], "completion": messages[-1:]}
        return {"messages": messages}

    return convert


CONVERTERS: dict[str, Converter] = {
    "alpaca": _alpaca,
    "sharegpt": lambda data: _turns(data, "conversations"),
    "messages": lambda data: _turns(data, "messages"),
    "prompt_completion": _prompt_completion,
    "text": lambda data: {"text": text(data, "text")},
}


def resolve_format(cfg: JobConfig | DataSpec, rows: list[Row] | Stream) -> tuple[str, Converter, bool]:
    """The format's name, its converter, and whether it was auto-detected (from each source's first readable row:
    a stream is read no further)."""
    if cfg.method != "sft":  # preference, unpaired, prompt-only and plain-text formats
        from tunestudio.worker.data import method_formats

        return method_formats.resolve(cfg, rows)
    if cfg.custom_format_mapping:
        return "custom", _custom(cfg.custom_format_mapping), False
    if cfg.format_type != "auto":
        return cfg.format_type, CONVERTERS[cfg.format_type], False
    sources: dict[str, list[Row]] = {}
    for row in firsts(rows):
        sources.setdefault(row.source, []).append(row)
    found = {source: detect_format(part) for source, part in sources.items()}
    if len(set(found.values())) > 1:
        listed = "; ".join(f"{source}: {fmt}" for source, fmt in found.items())
        raise UserError(f"the dataset files are in different formats ({listed}); train on one format at a time")
    fmt = next(iter(found.values()))
    return fmt, CONVERTERS[fmt], True
