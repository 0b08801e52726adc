"""Reading a row's fields, for every format of every method: text, and conversations.

A conversation is a list of turns spelled role/content (OpenAI's messages) or
from/value (sharegpt), whichever a turn uses; its roles are mapped onto user,
assistant and system. SFT's `messages` and `conversations` columns and the
preference formats' `prompt`, `chosen` and `rejected` read it the same way.

A row that cannot be read raises `RowProblem`, whose message completes
"dataset F row N ..."; the caller drops and counts the row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["HOW_TO_SET", "ROLES", "Converter", "RowProblem", "conversation", "text"]

Converter = Callable[[dict[str, Any]], dict[str, Any]]

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system",
         "bot": "assistant", "model": "assistant", "chatgpt": "assistant"}
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


def conversation(turns: list[Any], name: str) -> list[dict[str, str]]:
    """The turns of field `name` as role/content messages, each turn read in the spelling it uses;
    RowProblem names the field and the turn. The caller checks that the field holds a list of turns."""
    messages = []
    for i, turn in enumerate(turns, start=1):
        if not isinstance(turn, dict):
            raise RowProblem(f"turn {i} of {name!r} is not an object")
        role = turn.get("role", turn.get("from"))
        content = turn.get("content", turn.get("value"))
        if role is None or not isinstance(content, str):
            raise RowProblem(f"turn {i} of {name!r} needs role/content text (or from/value)")
        mapped = ROLES.get(str(role).strip().lower())
        if mapped is None:
            raise RowProblem(f"turn {i} of {name!r} needs role/content text: unknown role {role!r}")
        messages.append({"role": mapped, "content": content})
    return messages
