"""The dataset formats of the methods beyond SFT, and telling them from a dataset's columns.

- preference (DPO, ORPO, KTO): `prompt`, `chosen`, `rejected`, as strings or as
  conversations in the messages shape (tool calls too, the row's `tools` kept
  beside them; `prepare` renders such pairs to text with the model's template). Without `prompt`, the conversations'
  shared opening turns are the prompt. Where any row holds a conversation, every
  row becomes one (a string prompt a user turn, a string reply an assistant
  turn), so the chat template renders every part alike and the dataset has one
  shape.
- unpaired (KTO): `prompt`, `completion`, `label` (true: desirable).
- prompt_only (GRPO): `prompt` (string or messages) plus any other columns, kept
  as they are and passed to the reward functions (`answer` for the built-ins
  that compare with one).
- text (continued pretraining): `text`; every token is trained on.

`custom_format_mapping` renames columns to these fields ({"question": "prompt"}).
Fields and conversations are read by worker/data/conversations.py, as for the
SFT formats; a row that cannot be converted raises `RowProblem`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tunestudio.config import METHOD_FORMATS, DataSpec, JobConfig
from tunestudio.worker.data.conversations import Converter, RowProblem, check_calls, conversation, text, tools
from tunestudio.worker.data.rows import Row, Stream, firsts
from tunestudio.worker.errors import UserError

# The columns that identify each format; the first a method's columns fit is its format.
SIGNATURES: dict[str, set[str]] = {
    "unpaired": {"prompt", "completion", "label"},
    "preference": {"chosen", "rejected"},
    "prompt_only": {"prompt"},
    "text": {"text"},
}
_EXAMPLE_MAPPING = {
    "preference": '{"question": "prompt", "good": "chosen", "bad": "rejected"}',
    "unpaired": '{"question": "prompt", "reply": "completion", "ok": "label"}',
    "prompt_only": '{"question": "prompt", "solution": "answer"}',
    "text": '{"body": "text"}',
}
_TRUE = {"true", "yes", "1", "desirable", "good", "y", "t"}
_FALSE = {"false", "no", "0", "undesirable", "bad", "n", "f"}


def _how_to_set(fmt: str) -> str:
    return f"set custom_format_mapping to name your columns, e.g. {_EXAMPLE_MAPPING[fmt]}"


def _part(data: dict[str, Any], name: str, fmt: str, *, required: bool = True) -> str | list[dict[str, str]] | None:
    """A field that is text or a conversation; None if optional and absent."""
    value = data.get(name)
    if isinstance(value, list):
        if not value:
            raise RowProblem(f"has no {name!r} field (or it is empty); {_how_to_set(fmt)}")
        return conversation(value, name)
    if value is None or (isinstance(value, str) and not value.strip()):
        if not required:
            return None
        raise RowProblem(f"has no {name!r} field (or it is empty); {_how_to_set(fmt)}")
    if isinstance(value, dict):
        raise RowProblem(f"field {name!r} is an object, not text or a conversation")
    return str(value)


def _as_turns(value: str | list[dict[str, str]], role: str) -> list[dict[str, str]]:
    return value if isinstance(value, list) else [{"role": role, "content": value}]


def _split_shared_prompt(chosen: list[dict[str, str]], rejected: list[dict[str, str]]) -> int:
    """How many opening turns the two conversations share (the implicit prompt)."""
    shared = 0
    for a, b in zip(chosen, rejected, strict=False):
        if a != b:
            break
        shared += 1
    return shared


def preference(data: dict[str, Any], conversational: bool = False) -> dict[str, Any]:
    """A preference row; conversations keep the row's tools beside them ("tools"), their calls checked."""
    pair = _pair(data, conversational)
    declared = tools(data)
    if declared or any(isinstance(v, list) and any("tool_calls" in m for m in v) for v in pair.values()):
        for part in ("prompt", "chosen", "rejected"):
            if isinstance(pair[part], list):
                check_calls(pair[part], declared)
        if declared:
            pair["tools"] = declared
    return pair


def _pair(data: dict[str, Any], conversational: bool) -> dict[str, Any]:
    chosen = _part(data, "chosen", "preference")
    rejected = _part(data, "rejected", "preference")
    prompt = _part(data, "prompt", "preference", required=False)
    if prompt is None:
        if not (isinstance(chosen, list) and isinstance(rejected, list)):
            raise RowProblem(f"has no 'prompt' field; {_how_to_set('preference')} (or give 'chosen' and "
                             "'rejected' as conversations that open with the same prompt turns)")
        shared = _split_shared_prompt(chosen, rejected)
        if shared == 0 or shared == len(chosen) or shared == len(rejected):
            raise RowProblem("has no 'prompt' field, and its 'chosen' and 'rejected' conversations do not open "
                             "with shared prompt turns followed by different replies")
        return {"prompt": chosen[:shared], "chosen": chosen[shared:], "rejected": rejected[shared:]}
    if conversational or any(isinstance(v, list) for v in (prompt, chosen, rejected)):
        return {"prompt": _as_turns(prompt, "user"), "chosen": _as_turns(chosen, "assistant"),
                "rejected": _as_turns(rejected, "assistant")}
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected}


def _label(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    word = str(value).strip().lower() if value is not None else ""
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise RowProblem(f"field 'label' is {value!r}, not true or false (true: the completion is desirable)")


def unpaired(data: dict[str, Any], conversational: bool = False) -> dict[str, Any]:
    prompt = _part(data, "prompt", "unpaired")
    completion = _part(data, "completion", "unpaired")
    if "label" not in data or data["label"] is None:
        raise RowProblem(f"has no 'label' field (true: desirable, false: undesirable); {_how_to_set('unpaired')}")
    label = _label(data["label"])
    if conversational or isinstance(prompt, list) or isinstance(completion, list):
        prompt, completion = _as_turns(prompt, "user"), _as_turns(completion, "assistant")
    return {"prompt": prompt, "completion": completion, "label": label}


def prompt_only(answer_for: list[str], conversational: bool = False) -> Converter:
    """GRPO rows: the prompt, and every other column as it is; `answer_for` needs an answer in each row."""

    def convert(data: dict[str, Any]) -> dict[str, Any]:
        prompt = _part(data, "prompt", "prompt_only")
        if conversational:
            prompt = _as_turns(prompt, "user")
        if answer_for:
            value = data.get("answer")
            if value is None or (isinstance(value, str) and not value.strip()):
                raise RowProblem(f"has no 'answer' field, which reward function {' and '.join(answer_for)} "
                                 f"compares with; {_how_to_set('prompt_only')}")
            if "numeric_match" in answer_for:
                from tunestudio.worker.rewards import answer_number

                if answer_number(value) is None:
                    raise RowProblem(f"field 'answer' is {value!r}, not a number (numeric_match compares numbers)")
        return {**{k: v for k, v in data.items() if k != "prompt"}, "prompt": prompt}

    return convert


def _converter(fmt: str, cfg: JobConfig | DataSpec, conversational: bool) -> Converter:
    if fmt == "preference":
        return lambda data: preference(data, conversational)
    if fmt == "unpaired":
        return lambda data: unpaired(data, conversational)
    if fmt == "prompt_only":
        from tunestudio.worker.rewards import needs_answer

        return prompt_only(needs_answer(cfg), conversational)
    return lambda data: {"text": text(data, "text")}


def _holds_conversations(rows: Iterable[Row], mapping: dict[str, str] | None) -> bool:
    """Whether any row gives a prompt or reply as a list of turns (a stream is read until one does)."""
    fields = {"prompt", "chosen", "rejected", "completion"}
    columns = {c for c, f in mapping.items() if f in fields} if mapping else fields
    return any(isinstance(row.data.get(c), list) for row in rows if row.data is not None for c in columns)


def _renamed(mapping: dict[str, str], convert: Converter) -> Converter:
    def convert_mapped(data: dict[str, Any]) -> dict[str, Any]:
        # Mapped columns take their field's name (and win over a column already called that).
        renamed = {k: v for k, v in data.items() if k not in mapping and k not in mapping.values()}
        renamed.update({mapping[k]: v for k, v in data.items() if k in mapping})
        return convert(renamed)

    return convert_mapped


def detect(method: str, rows: list[Row]) -> str:
    """The method's format the first readable row's columns fit; UserError naming the columns if none does."""
    first = next((r for r in rows if r.data is not None), None)
    if first is None:
        raise UserError(f"{rows[0].where()}: no row of the dataset could be read ({rows[0].problem})")
    columns = set(first.data or {})
    for fmt in METHOD_FORMATS[method]:
        if SIGNATURES[fmt] <= columns:
            return fmt
    wanted = " or ".join(f"{fmt} ({', '.join(sorted(SIGNATURES[fmt]))})" for fmt in METHOD_FORMATS[method])
    raise UserError(f"dataset {first.source}: method {method!r} trains on {wanted}; the columns found are "
                    f"{sorted(columns)}; {_how_to_set(METHOD_FORMATS[method][0])}")


def resolve(cfg: JobConfig | DataSpec, rows: list[Row] | Stream) -> tuple[str, Converter, bool]:
    """The format's name, its converter, and whether it was auto-detected, for any method but sft."""
    formats = METHOD_FORMATS[cfg.method]
    if cfg.custom_format_mapping:
        targets = set(cfg.custom_format_mapping.values())
        fmt = next(f for f in formats if SIGNATURES[f] <= targets | ({"prompt"} if f == "preference" else set()))
        convert = _converter(fmt, cfg, _holds_conversations(rows, cfg.custom_format_mapping))
        return fmt, _renamed(cfg.custom_format_mapping, convert), False
    conversational = _holds_conversations(rows, None)
    if cfg.format_type != "auto":
        return cfg.format_type, _converter(cfg.format_type, cfg, conversational), False
    sources: dict[str, list[Row]] = {}
    for row in firsts(rows):
        sources.setdefault(row.source, []).append(row)
    found = {source: detect(cfg.method, part) for source, part in sources.items()}
    if len(set(found.values())) > 1:
        listed = "; ".join(f"{source}: {fmt}" for source, fmt in found.items())
        raise UserError(f"the dataset files are in different formats ({listed}); train on one format at a time")
    fmt = next(iter(found.values()))
    return fmt, _converter(fmt, cfg, conversational), True
