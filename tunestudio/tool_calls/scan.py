"""Reading JSON as it arrives: where a value ends, an object's members so far, a marker's beginning at the end.

A model writes its call one token at a time; the stream must know, at every point, which of the text so far is
settled. These scanners never guess: a value whose end has not arrived is `None` (incomplete), text that cannot
become JSON raises `NotJSON`, and `json.loads` has the last word on a value once it is whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field

_WS = " \t\r\n"
_LITERAL = frozenset("0123456789+-.eEtrufalsn")


class NotJSON(ValueError):
    """The text cannot be (the beginning of) the JSON value expected there."""


def skip_ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in _WS:
        i += 1
    return i


def string_end(s: str, i: int) -> int | None:
    """The index after the JSON string starting at s[i] (a quote); None while its closing quote has not come."""
    j = i + 1
    while j < len(s):
        if s[j] == "\\":
            j += 2
            continue
        if s[j] == '"':
            return j + 1
        j += 1
    return None


def value_end(s: str, i: int) -> int | None:
    """The index after the JSON value starting at s[i]; None while it is incomplete (a number or literal at the
    very end is incomplete too: another digit may follow). Raises NotJSON for what starts no value."""
    if i >= len(s):
        return None
    c = s[i]
    if c == '"':
        return string_end(s, i)
    if c in "{[":
        depth, j = 0, i
        while j < len(s):
            c = s[j]
            if c == '"':
                end = string_end(s, j)
                if end is None:
                    return None
                j = end
                continue
            if c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    return j + 1
            j += 1
        return None
    j = i
    while j < len(s) and s[j] in _LITERAL:
        j += 1
    if j == i:
        raise NotJSON(f"no JSON value at {s[i:i + 20]!r}")
    return j if j < len(s) else None


@dataclass
class ObjectScan:
    """A JSON object's members as far as the text goes: key → (value start, value end or None while incomplete);
    `end`: the index after its closing brace, None until it comes."""

    members: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    end: int | None = None
    error: str | None = None  # why the text cannot continue the object (the members before it are kept)


def scan_object(s: str, i: int) -> ObjectScan:
    """The members of the JSON object starting at s[i] (a brace), as far as the text goes; where the text cannot
    continue an object, the members read before it and the `error`."""
    scan = ObjectScan()
    try:
        _members(s, i, scan)
    except NotJSON as exc:
        scan.error = str(exc)
    return scan


def _members(s: str, i: int, scan: ObjectScan) -> ObjectScan:
    if i >= len(s) or s[i] != "{":
        raise NotJSON("not an object")
    j = skip_ws(s, i + 1)
    if j < len(s) and s[j] == "}":
        scan.end = j + 1
        return scan
    while j < len(s):
        if s[j] != '"':
            raise NotJSON("an object's key must be a string")
        key_end = string_end(s, j)
        if key_end is None:
            return scan
        key = s[j + 1:key_end - 1]
        j = skip_ws(s, key_end)
        if j >= len(s):
            return scan
        if s[j] != ":":
            raise NotJSON("a colon must follow an object's key")
        j = skip_ws(s, j + 1)
        if j >= len(s):
            return scan
        end = value_end(s, j)
        scan.members[key] = (j, end)
        if end is None:
            return scan
        j = skip_ws(s, end)
        if j >= len(s):
            return scan
        if s[j] == "}":
            scan.end = j + 1
            return scan
        if s[j] != ",":
            raise NotJSON("a comma or a brace must follow an object's member")
        j = skip_ws(s, j + 1)
    return scan


def held_back(text: str, markers: tuple[str, ...]) -> int:
    """How many characters at the end of `text` may begin one of the markers (held back until more text says)."""
    longest = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), longest, -1):
            if marker.startswith(text[-n:]):
                longest = n
                break
    return longest
