"""OpenAI's fine-tuning JSONL, read line by line: checked at upload, and turned into the studio's rows for a job.

Two kinds of rows (one kind per file):
- chat: `{"messages": [{"role", "content"}, ...]}` with at least one assistant message (supervised);
- preference: `{"input": {"messages": [...]}, "preferred_output": [assistant messages],
  "non_preferred_output": [assistant messages]}` (dpo).

A message's content is text, or a list of text parts; `developer` is the system role; `name` is kept out
of the prompt; `weight` 1 is the default (0, masking a turn, tunestudio cannot do yet). Tool calls, tool
messages and images are refused by name: the studio's chat formats hold text turns only.

The studio's own formats (worker/data/): chat rows become `{"messages": [{"role", "content"}]}`, the
`messages` format; preference rows become `{"prompt", "chosen", "rejected"}` as conversations, the
`preference` format. Standard library only: the parent process reads these files.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO, Literal

__all__ = ["BadFile", "Checked", "RowKind", "check", "convert", "rows"]

RowKind = Literal["chat", "preference"]
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
_PREFERENCE_KEYS = ("input", "preferred_output", "non_preferred_output")


class BadFile(ValueError):
    """A file that is not OpenAI's fine-tuning JSONL; the message names the first bad line."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(f"line {line}: {message}" if line is not None else message)
        self.line = line


@dataclass(frozen=True)
class Checked:
    kind: RowKind
    rows: int


def _lines(handle: BinaryIO) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, row) for each non-blank line; BadFile for one that is not a JSON object."""
    for number, raw in enumerate(handle, start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise BadFile("is not UTF-8 text", number) from None
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BadFile(f"is not valid JSON ({exc.msg} at column {exc.colno}); each line must be one JSON "
                          "object", number) from None
        if not isinstance(row, dict):
            raise BadFile(f"is a JSON {type(row).__name__}, not an object", number)
        yield number, row


def kind_of(row: dict[str, Any]) -> RowKind | None:
    if "messages" in row:
        return "chat"
    if any(key in row for key in _PREFERENCE_KEYS):
        return "preference"
    return None


def _content(message: dict[str, Any], where: str) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ValueError(f"{where} has a content part of type {kind!r}; only text parts "
                                 '({"type": "text", "text": ...}) can be trained on')
            parts.append(part["text"])
        return "".join(parts)
    if content is None and (message.get("tool_calls") or message.get("function_call")):
        raise ValueError(f"{where} is a tool call; tunestudio trains on text turns only (no tool calls yet)")
    raise ValueError(f"{where} has no text 'content'")


def _messages(value: Any, field: str, *, assistant_only: bool = False) -> list[dict[str, str]]:
    """The messages of `field` as {role, content} text turns; ValueError naming the message that is wrong."""
    if not isinstance(value, list) or not value:
        raise ValueError(f"'{field}' must be a non-empty list of messages")
    out = []
    for i, message in enumerate(value, start=1):
        where = f"message {i} of '{field}'"
        if not isinstance(message, dict):
            raise ValueError(f"{where} is not an object")
        role = message.get("role")
        if role in ("tool", "function"):
            raise ValueError(f"{where} has role {role!r}; tunestudio trains on text turns only (no tool calls yet)")
        if role not in _ROLES:
            raise ValueError(f"{where} has role {role!r}; use system, developer, user or assistant")
        if assistant_only and role != "assistant":
            raise ValueError(f"{where} has role {role!r}; the outputs of a preference row are assistant messages")
        if message.get("tool_calls") or message.get("function_call"):
            raise ValueError(f"{where} has tool calls; tunestudio trains on text turns only (no tool calls yet)")
        weight = message.get("weight", 1)
        if weight not in (0, 1) or isinstance(weight, bool):
            raise ValueError(f"{where} has weight {weight!r}; weight is 0 or 1")
        if weight == 0:
            raise ValueError(f"{where} has weight 0; tunestudio trains on every assistant message (leave weight "
                             "out, or drop the message)")
        out.append({"role": _ROLES[role], "content": _content(message, where)})
    return out


def _no_tools(row: dict[str, Any], where: dict[str, Any] | None = None) -> None:
    for holder in (row, where or {}):
        if holder.get("tools") or holder.get("functions"):
            raise ValueError("has 'tools'; tunestudio trains on text turns only (no tool calls yet)")


def _studio_row(row: dict[str, Any], kind: RowKind) -> dict[str, Any]:
    """One OpenAI row as the studio's row; ValueError saying what is wrong with it."""
    if kind == "chat":
        _no_tools(row)
        messages = _messages(row.get("messages"), "messages")
        if not any(m["role"] == "assistant" for m in messages):
            raise ValueError("has no assistant message to learn from")
        return {"messages": messages}
    missing = [key for key in _PREFERENCE_KEYS if key not in row]
    if missing:
        raise ValueError(f"has no {', '.join(repr(k) for k in missing)}; a preference row has 'input' "
                         '({"messages": [...]}), \'preferred_output\' and \'non_preferred_output\'')
    given = row["input"]
    if not isinstance(given, dict):
        raise ValueError("'input' must be an object with 'messages'")
    _no_tools(row, given)
    prompt = _messages(given.get("messages"), "input.messages")
    chosen = _messages(row["preferred_output"], "preferred_output", assistant_only=True)
    rejected = _messages(row["non_preferred_output"], "non_preferred_output", assistant_only=True)
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected}


def rows(handle: BinaryIO, want: RowKind | None = None) -> Iterator[dict[str, Any]]:
    """The file's rows as the studio's rows, in order. BadFile names the first line that is wrong: not JSON, of
    another kind than the first row (or than `want`), or not a valid row of its kind."""
    kind = want
    for number, row in _lines(handle):
        found = kind_of(row)
        if found is None:
            raise BadFile(f"has neither 'messages' (a chat row) nor 'input', 'preferred_output' and "
                          f"'non_preferred_output' (a preference row); its keys are {sorted(row)[:10]}", number)
        if kind is None:
            kind = found
        elif found != kind:
            expected = "chat rows ('messages')" if kind == "chat" else "preference rows ('input', ...)"
            raise BadFile(f"is a {found} row, but {'this job needs' if want else 'the file holds'} {expected}",
                          number)
        try:
            yield _studio_row(row, kind)
        except ValueError as exc:
            raise BadFile(str(exc), number) from None


def check(handle: BinaryIO, want: RowKind | None = None) -> Checked:
    """The file's kind and how many rows it has; BadFile for the first bad line, or for a file with no rows."""
    count, kind = 0, want
    for row in rows(handle, want):
        count += 1
        kind = "chat" if "messages" in row else "preference"
    if count == 0 or kind is None:
        raise BadFile("the file has no rows: each line is one JSON object (a chat row with 'messages', or a "
                      "preference row with 'input', 'preferred_output' and 'non_preferred_output')")
    return Checked(kind, count)


def convert(source: BinaryIO, out: BinaryIO, want: RowKind) -> int:
    """Write the studio's rows of `source` to `out` as JSONL; the number of rows. BadFile as `rows`."""
    count = 0
    for row in rows(source, want):
        out.write(json.dumps(row, ensure_ascii=False).encode("utf-8") + b"\n")
        count += 1
    if count == 0:
        raise BadFile("the file has no rows")
    return count
