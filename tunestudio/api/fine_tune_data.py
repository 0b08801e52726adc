"""OpenAI's fine-tuning JSONL, read line by line: checked at upload, and turned into the studio's rows for a job.

Two kinds of rows (one kind per file):
- chat: `{"messages": [{"role", "content"}, ...]}` with at least one assistant message (supervised);
- preference: `{"input": {"messages": [...]}, "preferred_output": [assistant messages],
  "non_preferred_output": [assistant messages]}` (dpo).

A message's content is text, or a list of text parts; `developer` is the system role; `name` is kept out
of the prompt; `weight` 1 is the default, 0 keeps an assistant message out of the loss. Rows with `tools` (or
the older `functions`), assistant `tool_calls` (or `function_call`) and `tool` (or `function`) messages are read
as tunestudio/chat_rows.py reads them, and refused by line as it refuses them (arguments not JSON, a tool
message answering no call, tools whose parameters are not a JSON Schema object, a call to a function the row's
tools do not declare). Images are refused by name.

The studio's own formats (worker/data/): chat rows become `{"messages": [...], "tools"?: [...]}` in OpenAI's
form, the `messages` format; preference rows become `{"prompt", "chosen", "rejected", "tools"?}` as
conversations, the `preference` format. Standard library only: the parent process reads these files.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO, Literal

from tunestudio.chat_rows import BadTurn, read_turns, tools_of, unknown_calls

__all__ = ["BadFile", "Checked", "RowKind", "check", "convert", "rows"]

RowKind = Literal["chat", "preference"]
_ROLES = {"system", "developer", "user", "assistant", "tool", "function"}
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


def _text_parts(message: dict[str, Any], where: str) -> None:
    """Content parts that are not text (images, audio, files) are refused by name."""
    content = message.get("content")
    if isinstance(content, list):
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ValueError(f"{where} has a content part of type {kind!r}; only text parts "
                                 '({"type": "text", "text": ...}) can be trained on')


def _messages(value: Any, field: str, *, assistant_only: bool = False) -> list[dict[str, Any]]:
    """The messages of `field` in OpenAI's form, as tunestudio/chat_rows.py reads them (tool calls, tool results,
    reasoning, weight); ValueError naming the message that is wrong."""
    if not isinstance(value, list) or not value:
        raise ValueError(f"'{field}' must be a non-empty list of messages")
    for i, message in enumerate(value, start=1):
        where = f"message {i} of '{field}'"
        if not isinstance(message, dict):
            raise ValueError(f"{where} is not an object")
        role = message.get("role")
        if role not in _ROLES:
            raise ValueError(f"{where} has role {role!r}; use system, developer, user, assistant or tool")
        if assistant_only and role != "assistant":
            raise ValueError(f"{where} has role {role!r}; the outputs of a preference row are assistant messages")
        _text_parts(message, where)
        if role != "assistant" and message.get("content") is None:
            raise ValueError(f"{where} has no text 'content'")
    try:
        return read_turns(value, field, word="message")
    except BadTurn as exc:
        raise ValueError(str(exc)) from None


def _tools(*holders: dict[str, Any]) -> list[dict[str, Any]] | None:
    for holder in holders:
        try:
            found = tools_of(holder)
        except BadTurn as exc:
            raise ValueError(str(exc)) from None
        if found:
            return found
    return None


def _declared(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> None:
    unknown = unknown_calls(messages, tools)
    if unknown:
        raise ValueError(f"calls {', '.join(sorted({repr(n) for n in unknown}))}, which its 'tools' do not declare")


def _studio_row(row: dict[str, Any], kind: RowKind) -> dict[str, Any]:
    """One OpenAI row as the studio's row; ValueError saying what is wrong with it."""
    if kind == "chat":
        tools = _tools(row)
        messages = _messages(row.get("messages"), "messages")
        if not any(m["role"] == "assistant" for m in messages):
            raise ValueError("has no assistant message to learn from")
        if not any(m["role"] == "assistant" and m.get("weight", 1) for m in messages):
            raise ValueError("has no assistant message to learn from: every one has weight 0")
        _declared(messages, tools)
        return {"messages": messages, **({"tools": tools} if tools else {})}
    missing = [key for key in _PREFERENCE_KEYS if key not in row]
    if missing:
        raise ValueError(f"has no {', '.join(repr(k) for k in missing)}; a preference row has 'input' "
                         '({"messages": [...]}), \'preferred_output\' and \'non_preferred_output\'')
    given = row["input"]
    if not isinstance(given, dict):
        raise ValueError("'input' must be an object with 'messages'")
    tools = _tools(given, row)
    prompt = _messages(given.get("messages"), "input.messages")
    chosen = _messages(row["preferred_output"], "preferred_output", assistant_only=True)
    rejected = _messages(row["non_preferred_output"], "non_preferred_output", assistant_only=True)
    for part in (prompt, chosen, rejected):
        _declared(part, tools)
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected, **({"tools": tools} if tools else {})}


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
