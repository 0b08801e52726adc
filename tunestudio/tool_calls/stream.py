"""A model's output read as it streams: reasoning, content and calls as OpenAI's chunk deltas, and the whole.

`CallStream.feed(text)` takes the next piece of output and answers the deltas it settles, in OpenAI's chunk shape
(`{"reasoning_content": ...}`, `{"content": ...}`, `{"tool_calls": [{"index", "id", "type", "function":
{"name", "arguments"}}]}`: a call's id and name in its first delta, its arguments in the ones after).
`finish()` answers the last deltas and the whole `Parsed` output; `parse(text)` is the same for a whole output,
so a streamed answer and a whole one always agree. Each feed cuts the whole text so far again (outputs are
short) and sends what grew since the last cut.

Reasoning: `<think>…</think>` at the start of the output (or, when the prompt ended inside `<think>`, the text
up to `</think>`) is split out when the template thinks; a harmony family splits its own analysis channel.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tunestudio.tool_calls.families import Call, Family, Names, Segment, Text
from tunestudio.tool_calls.scan import held_back, skip_ws

THINK, END_THINK = "<think>", "</think>"


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # the JSON object's text as the model wrote it

    def openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class Parsed:
    """A whole output: its content (None when only calls or nothing), reasoning (None: none), calls, and the
    first broken call's error (None: every call is whole)."""

    content: str | None
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    error: str | None = None
    cut: bool = False  # the broken call is broken only because the output ended inside it


def split_think(text: str, final: bool, open_at_start: bool = False) -> tuple[str | None, int | None]:
    """(the reasoning so far or None when there is none, where the rest of the output begins or None while it
    is still reasoning or not known)."""
    i = skip_ws(text, 0)
    if open_at_start:
        start = 0
    elif text.startswith(THINK, i):
        start = i + len(THINK)
    elif not final and THINK.startswith(text[i:]):
        return None, None  # may be the beginning of <think>
    else:
        return None, 0
    close = text.find(END_THINK, start)
    if close >= 0:
        return text[start:close], close + len(END_THINK)
    reasoning = text[start:]
    return (reasoning if final else reasoning[:len(reasoning) - held_back(reasoning, (END_THINK,))]), None


def _settled(text: str, final: bool) -> str:
    """Content or reasoning as sent: no blanks before it, and blanks at its end only once more text follows
    them (the whole answer has none), so what is sent is always the beginning of the whole."""
    text = text.lstrip()
    return text.rstrip() if final or text[-1:].isspace() else text


class CallStream:
    """One output's reader. family: the template's (None: no calls are read); names: the request's functions;
    think: the template writes `<think>` reasoning; think_open: the prompt ended inside `<think>`."""

    def __init__(self, family: Family | None, names: Names = None, think: bool = False,
                 think_open: bool = False) -> None:
        self.family, self.names, self.think, self.think_open = family, names, think, think_open
        self.text = ""
        self.sent = {"content": "", "reasoning_content": ""}
        self.calls: list[tuple[str, str, str]] = []  # (id, name, arguments sent)
        self.error: str | None = None
        self.cut = False

    def feed(self, text: str) -> list[dict[str, Any]]:
        self.text += text
        return self._deltas(final=False)

    def finish(self) -> tuple[list[dict[str, Any]], Parsed]:
        deltas = self._deltas(final=True)
        content, reasoning = self.sent["content"], self.sent["reasoning_content"]
        return deltas, Parsed(content or None, reasoning or None,
                              [ToolCall(i, n, a) for i, n, a in self.calls], self.error, self.cut)

    def _segments(self, final: bool) -> list[Segment]:
        text, items = self.text, []
        if self.think:
            reasoning, rest = split_think(text, final, self.think_open)
            if reasoning is not None:
                items.append(Text("reasoning", reasoning))
            if rest is None:
                return items
            text = text[rest:]
        if self.family is None:
            return [*items, Text("content", text)]
        return [*items, *self.family.segments(text, final, self.names)]

    def _deltas(self, final: bool) -> list[dict[str, Any]]:
        segments = self._segments(final)
        deltas: list[dict[str, Any]] = []
        for key, kind in (("reasoning_content", "reasoning"), ("content", "content")):
            whole = _settled("".join(s.text for s in segments if isinstance(s, Text) and s.kind == kind), final)
            if len(whole) > len(self.sent[key]) and whole.startswith(self.sent[key]):
                deltas.append({key: whole[len(self.sent[key]):]})
                self.sent[key] = whole
        for index, call in enumerate(s for s in segments if isinstance(s, Call)):
            deltas.extend(self._call_deltas(index, call))
        return deltas

    def _call_deltas(self, index: int, call: Call) -> list[dict[str, Any]]:
        if call.error is not None and self.error is None:
            self.error, self.cut = call.error, call.cut
        if index == len(self.calls):
            call_id = self.family.call_id() if self.family else ""
            self.calls.append((call_id, call.name, call.arguments))
            return [{"tool_calls": [{"index": index, "id": call_id, "type": "function",
                                     "function": {"name": call.name, "arguments": call.arguments}}]}]
        call_id, name, sent = self.calls[index]
        if len(call.arguments) <= len(sent) or not call.arguments.startswith(sent):
            return []
        self.calls[index] = (call_id, name, call.arguments)
        return [{"tool_calls": [{"index": index, "function": {"arguments": call.arguments[len(sent):]}}]}]


def parse(text: str, family: Family | None, names: Names = None, think: bool = False,
          think_open: bool = False) -> Parsed:
    """A whole output read as `CallStream` reads it streamed."""
    stream = CallStream(family, names, think, think_open)
    stream.feed(text)
    return stream.finish()[1]
