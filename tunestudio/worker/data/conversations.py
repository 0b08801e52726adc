"""Reading a row's fields, for every format of every method: text, and conversations.

A conversation is a list of turns spelled role/content (OpenAI's messages) or
from/value (sharegpt), whichever a turn uses, read into OpenAI's form with its
tool calls, tool results and reasoning (tunestudio/chat_rows.py). SFT's `messages` and `conversations` columns and the
preference formats' `prompt`, `chosen` and `rejected` read it the same way.

A row that cannot be read raises `RowProblem`, whose message completes
"dataset F row N ..."; the caller drops and counts the row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tunestudio.chat_rows import ROLES, BadTurn, read_turns, tools_of, unknown_calls

__all__ = ["HOW_TO_SET", "ROLES", "Converter", "RowProblem", "check_calls", "conversation", "text", "tools"]

Converter = Callable[[dict[str, Any]], dict[str, Any]]

# What to do about a row whose columns are not the ones expected (the SFT formats; the text format shares it).
HOW_TO_SET = ("set format_type (alpaca, sharegpt, messages, prompt_completion, text) or custom_format_mapping, "
              'e.g. {"question": "user", "answer": "assistant"}')


class RowProblem(Exception):
    """One row cannot be used; the message completes "dataset F row N ..."."""


def text(data: dict[str, Any], name: str, *, required: bool = True) -> str:
    """The text of field `name` ("" if it is absent, empty and not required)."""
    value = data.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            raise RowProblem(f"has no {name!r} field (or it is empty); {HOW_TO_SET} to match your columns")
        return ""
    if isinstance(value, (dict, list)):
        raise RowProblem(f"field {name!r} is a {type(value).__name__}, not text")
    return str(value)


def conversation(turns: list[Any], name: str) -> list[dict[str, Any]]:
    """The turns of field `name` in OpenAI's form (tunestudio/chat_rows.py: text turns, tool calls, tool results,
    reasoning), each turn read in the spelling it uses; RowProblem names the field and the turn. The caller
    checks that the field holds a list of turns."""
    try:
        return read_turns(turns, name)
    except BadTurn as exc:
        raise RowProblem(str(exc)) from None


def tools(data: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The row's tools (`tools`, or the older `functions`) in OpenAI's form, or None; RowProblem when a tool is
    not a function with a JSON Schema object for its parameters."""
    try:
        return tools_of(data)
    except BadTurn as exc:
        raise RowProblem(str(exc)) from None


def check_calls(messages: list[dict[str, Any]], declared: list[dict[str, Any]] | None) -> None:
    """RowProblem when a call names a function the row's tools do not declare: the model would learn to call a
    tool it is not given (a row without tools is not checked: its tools may be described in its text)."""
    unknown = unknown_calls(messages, declared)
    if unknown:
        names = ", ".join(sorted({repr(n) for n in unknown}))
        raise RowProblem(f"calls {names}, which its 'tools' do not declare")
