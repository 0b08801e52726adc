"""The chat template families that call tools, each read from a model's output by `segments`.

A family knows three things: how its template's reply begins a call (`opener`: the text a reply starts with when
a call must come, with the function's name when one is named), which special tokens its calls are made of
(`markers`: the worker keeps them when it decodes), and how to cut an output into content, reasoning and calls.
`segments(text, final)` cuts the text so far; with `final=False` it leaves out what more text could still change
(the beginning of a marker, a call whose name has not ended), so each cut's pieces only ever grow: the stream
sends the difference. A call is a call once its name is whole (and among the request's tools when they are
known); before that, text that turns out not to be one stays content. A call that then breaks (arguments that
are not a JSON object, a call that never closes) is a `Call` with its `error`.
"""

from __future__ import annotations

import json
import re
import secrets
import string
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

from tunestudio.tool_calls.scan import NotJSON, held_back, scan_object, skip_ws, value_end


@dataclass
class Text:
    kind: Literal["content", "reasoning"]
    text: str


@dataclass
class Call:
    """A call so far: its name (whole), its arguments' JSON text as written (so far), whether it has ended, and
    why it is broken (None: it is not)."""

    name: str
    arguments: str
    closed: bool
    error: str | None = None
    cut: bool = False  # broken only because the text ended inside it (a reply cut at max_tokens)


Segment = Text | Call
Names = Collection[str] | None  # the request's function names; None: any name is a call


class _Out:
    def __init__(self) -> None:
        self.items: list[Segment] = []

    def text(self, text: str, kind: Literal["content", "reasoning"] = "content") -> None:
        if not text:
            return
        last = self.items[-1] if self.items else None
        if isinstance(last, Text) and last.kind == kind:
            last.text += text
        else:
            self.items.append(Text(kind, text))

    def call(self, call: Call) -> None:
        self.items.append(call)


def _json_name(s: str, span: tuple[int, int | None] | None) -> str | Literal[False] | None:
    """A member's value as a name: the string; None while it has not ended; False when it is no string."""
    if span is None or span[1] is None:
        return None
    try:
        value = json.loads(s[span[0]:span[1]])
    except ValueError:
        return False
    return value if isinstance(value, str) and value else False


def finished_call(name: str, arguments: str) -> Call:
    """A call whose arguments have ended: whole when they are a JSON object, else broken."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return Call(name, arguments, True, f"the model's call to {name} has arguments that are not JSON")
    if not isinstance(value, dict):
        return Call(name, arguments, True, f"the model's call to {name} has arguments that are not a JSON object")
    return Call(name, arguments, True)


def json_call(s: str, i: int, names: Names, args_keys: tuple[str, ...],
              ended: bool) -> tuple[Literal["pending", "content", "call"], Call | None, int | None]:
    """A call written as a JSON object `{"name": ..., "<args key>": {...}}` at s[i] (after blanks): ("call",
    the call so far, the index after the object or None), ("pending", ...) while more text must say, or
    ("content", ...) when it is no call. `ended`: no more text comes for it (its region closed, or the output)."""
    i = skip_ws(s, i)
    if i >= len(s):
        return ("content" if ended else "pending"), None, None
    scan = scan_object(s, i)
    name = _json_name(s, scan.members.get("name"))
    if name is False or (name is not None and names is not None and name not in names):
        return "content", None, None
    if name is None:
        return ("content" if ended or scan.end is not None or scan.error else "pending"), None, None
    span = next((scan.members[k] for k in args_keys if k in scan.members), None)
    arguments = "" if span is None else s[span[0]:span[1]] if span[1] is not None else s[span[0]:]
    if scan.error is not None:
        return "call", Call(name, arguments, True, f"the model's call to {name} is not JSON ({scan.error})"), None
    if scan.end is not None:
        if span is None:
            return "call", Call(name, "{}", True), scan.end  # a call with no arguments: an empty object
        return "call", finished_call(name, arguments), scan.end
    if ended:
        return "call", Call(name, arguments, True, f"the model's call to {name} ends before its arguments do",
                            cut=True), None
    return "call", Call(name, arguments, False), None


def _cut(text: str, final: bool, markers: tuple[str, ...]) -> str:
    return text if final else text[:len(text) - held_back(text, markers)]


class Family:
    name = ""
    markers: tuple[str, ...] = ()

    def opener(self, name: str | None = None) -> str:
        raise NotImplementedError

    def segments(self, text: str, final: bool, names: Names = None) -> list[Segment]:
        raise NotImplementedError

    def call_id(self) -> str:
        return f"call_{uuid.uuid4().hex[:24]}"


class Hermes(Family):
    """Hermes, Qwen 2.5/3, SmolLM3: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, one block a
    call, inside the assistant turn."""

    name = "hermes"
    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    markers = (OPEN, CLOSE)

    def opener(self, name: str | None = None) -> str:
        return f'{self.OPEN}\n{{"name": "' + (f'{name}", "arguments": ' if name else "")

    def segments(self, text: str, final: bool, names: Names = None) -> list[Segment]:
        out, pos = _Out(), 0
        while True:
            i = text.find(self.OPEN, pos)
            if i < 0:
                out.text(_cut(text[pos:], final, (self.OPEN,)))
                return out.items
            out.text(text[pos:i])
            start = i + len(self.OPEN)
            close = text.find(self.CLOSE, start)
            body = text[start:close] if close >= 0 else text[start:]
            state, call, _ = json_call(body, 0, names, ("arguments", "parameters"), close >= 0 or final)
            if state == "pending":
                return out.items
            if state == "content" or call is None:  # the marker was text: read on after it
                out.text(self.OPEN)
                pos = start
                continue
            out.call(call)
            if close < 0:
                return out.items
            pos = close + len(self.CLOSE)


class Llama3(Family):
    """Llama 3.1/3.2/3.3's JSON calls: the reply is `{"name": ..., "parameters": {...}}` (after `<|python_tag|>`
    on some), several separated by `;`. Text that does not begin with one is content (as Llama's own parser)."""

    name = "llama3"
    TAG = "<|python_tag|>"
    markers = (TAG,)

    def opener(self, name: str | None = None) -> str:
        return '{"name": "' + (f'{name}", "parameters": ' if name else "")

    def segments(self, text: str, final: bool, names: Names = None) -> list[Segment]:
        out = _Out()
        i = skip_ws(text, 0)
        if text.startswith(self.TAG, i):
            i = skip_ws(text, i + len(self.TAG))
        elif not final and self.TAG.startswith(text[i:]):
            return []
        if i >= len(text) or text[i] != "{":
            out.text(text if final or i < len(text) else "")
            return out.items
        while True:
            state, call, end = json_call(text, i, names, ("parameters", "arguments"), final)
            if state == "pending":
                return out.items
            if state == "content" or call is None:
                if not out.items:
                    return [Text("content", text)]
                out.text(text[i:])
                return out.items
            out.call(call)
            if end is None:
                return out.items
            j = skip_ws(text, end)
            if j < len(text) and text[j] == ";":
                j = skip_ws(text, j + 1)
            if j >= len(text):
                return out.items
            if text[j] != "{":
                out.text(text[j:])
                return out.items
            i = j


class Mistral(Family):
    """Mistral's `[TOOL_CALLS]`: a JSON list `[{"name": ..., "arguments": {...}}, ...]` (v3 templates), or
    `name[ARGS]{...}` per call (v11 and later, `[TOOL_CALLS]` before each). Its templates refuse call ids other
    than 9 letters and digits, so its ids are those."""

    name = "mistral"
    OPEN, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
    markers = (OPEN, ARGS, CALL_ID)

    def __init__(self, args_layout: bool = False) -> None:
        self.args_layout = args_layout  # the template writes name[ARGS]{...}
        self.name = "mistral-args" if args_layout else "mistral"

    def opener(self, name: str | None = None) -> str:
        if self.args_layout:
            return self.OPEN + (f"{name}{self.ARGS}" if name else "")
        return self.OPEN + '[{"name": "' + (f'{name}", "arguments": ' if name else "")

    def call_id(self) -> str:
        return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))

    def segments(self, text: str, final: bool, names: Names = None) -> list[Segment]:
        out, pos = _Out(), 0
        while True:
            i = text.find(self.OPEN, pos)
            if i < 0:
                out.text(_cut(text[pos:], final, (self.OPEN,)))
                return out.items
            out.text(text[pos:i])
            j = skip_ws(text, i + len(self.OPEN))
            if j >= len(text):
                return out.items if not final else [*out.items, Text("content", text[i:])]
            read = self._list(text, j, final, names, out) if text[j] == "[" else self._named(text, j, final, names,
                                                                                              out)
            if read is None:  # no call after all: the marker was text
                out.text(self.OPEN)
                pos = i + len(self.OPEN)
            elif read < 0:
                return out.items
            else:
                pos = read

    def _list(self, text: str, j: int, final: bool, names: Names, out: _Out) -> int | None:
        """Calls of a JSON list at text[j]: the index to read on from, -1 when the text so far is used up, None
        when it holds no call."""
        j, calls = skip_ws(text, j + 1), 0
        while j < len(text):
            state, call, end = json_call(text, j, names, ("arguments",), final)
            if state == "pending":
                return -1
            if state == "content" or call is None:
                if calls:
                    out.text(text[j:])
                    return -1
                return None
            out.call(call)
            calls += 1
            if end is None:
                return -1
            j = skip_ws(text, end)
            if j < len(text) and text[j] == ",":
                j = skip_ws(text, j + 1)
            elif j < len(text) and text[j] == "]":
                return j + 1
        return -1

    def _named(self, text: str, j: int, final: bool, names: Names, out: _Out) -> int | None:
        """One `name[ARGS]{...}` call at text[j]: the index to read on from, -1 when the text so far is used up,
        None when it is no call."""
        a = text.find(self.ARGS, j)
        head = text[j:a] if a >= 0 else text[j:]
        if a < 0:  # the name so far, less what may begin [ARGS] or [CALL_ID]
            head = head[:len(head) - held_back(head, (self.ARGS, self.CALL_ID))]
        name = head.split(self.CALL_ID)[0].strip()
        if not re.fullmatch(r"[\w.-]*", name) or (a >= 0 and not name) or (
                a >= 0 and names is not None and name not in names):
            return None
        if a < 0:
            return None if final else -1
        start = skip_ws(text, a + len(self.ARGS))
        try:
            end = value_end(text, start)
        except NotJSON:
            out.call(Call(name, "", True, f"the model's call to {name} has arguments that are not JSON"))
            return -1
        if end is None:
            out.call(Call(name, text[start:], True, f"the model's call to {name} ends before its arguments do",
                          cut=True) if final else Call(name, text[start:], False))
            return -1
        out.call(finished_call(name, text[start:end]))
        return end


class Harmony(Family):
    """gpt-oss's harmony: messages `<|channel|>analysis<|message|>...<|end|>` (reasoning), `<|channel|>final
    <|message|>...<|return|>` (content), and calls `to=functions.NAME<|channel|>commentary json<|message|>{...}
    <|call|>` (the recipient before or after the channel)."""

    name = "harmony"
    START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
    ENDS = ("<|end|>", "<|call|>", "<|return|>")
    markers = (START, CHANNEL, MESSAGE, CONSTRAIN, *ENDS)

    def opener(self, name: str | None = None) -> str:
        return " to=functions." + (f"{name}{self.CHANNEL}commentary json{self.MESSAGE}" if name else "")

    def segments(self, text: str, final: bool, names: Names = None) -> list[Segment]:
        out, pos = _Out(), 0
        while pos < len(text):
            m = text.find(self.MESSAGE, pos)
            if m < 0:
                rest = text[pos:]
                if not final and (rest.lstrip().startswith(("<|", "to=")) or "<|".startswith(rest.lstrip())):
                    return out.items  # a header under way
                if not out.items:  # no harmony at all: the model wrote plain text
                    out.text(_cut(rest, final, ()))
                return out.items
            header, body_start = text[pos:m], m + len(self.MESSAGE)
            found = [(k, e) for e in self.ENDS if (k := text.find(e, body_start)) >= 0]
            end, marker = min(found) if found else (-1, "")
            body = text[body_start:end] if end >= 0 else _cut(text[body_start:], final, self.ENDS)
            recipient = re.search(r"to=functions\.([\w.-]+)", header)
            channel = re.search(re.escape(self.CHANNEL) + r"\s*(\w+)", header)
            if recipient and (names is None or recipient.group(1) in names):
                name = recipient.group(1)
                # blanks around the JSON are no part of it (held back while more may follow)
                call = finished_call(name, body.strip()) if end >= 0 or final else Call(name, body.strip(), False)
                call.cut = end < 0 and call.error is not None
                out.call(call)
            else:
                out.text(body, "reasoning" if channel and channel.group(1) == "analysis" else "content")
            if end < 0:
                return out.items
            pos = end + len(marker)
        return out.items


FAMILIES: dict[str, type[Family]] = {"hermes": Hermes, "llama3": Llama3, "mistral": Mistral, "harmony": Harmony}


def detect(template: str | None) -> Family | None:
    """The family a chat template writes calls in, read from its text; None: it does not call tools."""
    if not template:
        return None
    if "<|channel|>" in template and "to=functions" in template:
        return Harmony()
    if "[TOOL_CALLS]" in template:
        return Mistral(args_layout="[ARGS]" in template)
    if "<tool_call>" in template:
        return Hermes()
    if "tools" in template and ('"parameters"' in template or "<|python_tag|>" in template):
        return Llama3()
    return None


def family_named(name: str) -> Family:
    """A family by its name (`Family.name`; "mistral-args" for Mistral's name[ARGS] layout)."""
    if name == "mistral-args":
        return Mistral(args_layout=True)
    return FAMILIES[name]()
