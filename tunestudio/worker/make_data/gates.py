"""The gates a made row passes before it is kept, one row at a time as the teacher's replies come.

question_length and answer_length (characters, every user and assistant turn); duplicate (the row's text repeats a
kept row's: exact after normalising case and spacing, or near: word 3-gram Jaccard similarity of at least
`near_threshold`); against (the same, against the rows of the files the recipe names). Rows come one at a
time, so near duplicates are found exactly on an index of 3-grams (the candidates share one) rather than with
the dataset report's batch MinHash: a few thousand rows compare in milliseconds and the verdict is exact.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from tunestudio.make_data_config import Gates

__all__ = ["Gatekeeper", "length_verdict", "text_of"]

_SEPARATORS = re.compile(r"[\W_]+")


def text_of(messages: list[dict[str, Any]]) -> str:
    """The words a row's user and assistant turns say, its tool calls (name and arguments) included."""
    return "\n".join(
        "\n".join([str(m.get("content") or ""),
                   *(f"{c['function']['name']} {c['function']['arguments']}" for c in m.get("tool_calls", ()))])
        for m in messages if m.get("role") in ("user", "assistant"))


def _words(text: str) -> list[str]:
    return _SEPARATORS.sub(" ", text.casefold()).split()


def _grams(words: list[str]) -> frozenset[tuple[str, ...]]:
    if len(words) <= 3:
        return frozenset([tuple(words)])
    return frozenset(tuple(words[i:i + 3]) for i in range(len(words) - 2))


class _Index:
    """Texts seen, by their normalised words (exact) and their 3-grams (near)."""

    def __init__(self) -> None:
        self.exact: set[str] = set()
        self.grams: list[frozenset[tuple[str, ...]]] = []
        self.by_gram: dict[tuple[str, ...], list[int]] = defaultdict(list)

    def add(self, text: str) -> None:
        words = _words(text)
        self.exact.add(" ".join(words))
        grams = _grams(words)
        for gram in grams:
            self.by_gram[gram].append(len(self.grams))
        self.grams.append(grams)

    def matches(self, text: str, near: float | None) -> bool:
        words = _words(text)
        if " ".join(words) in self.exact:
            return True
        if near is None:
            return False
        grams = _grams(words)
        candidates = {i for gram in grams for i in self.by_gram.get(gram, ())}
        return any(len(grams & self.grams[i]) / len(grams | self.grams[i]) >= near for i in candidates)


def length_verdict(gates: Gates, messages: list[dict[str, Any]]) -> tuple[str, str] | None:
    """(gate, why) when a turn is too short or too long, else None: the row alone (any thread may ask)."""
    for turn in messages:
        size = len(turn.get("content") or "")
        if turn["role"] == "user" and size < gates.min_question_chars:
            return "question_length", (f"a user turn of {size} characters (min_question_chars "
                                       f"{gates.min_question_chars})")
        if turn.get("tool_calls") and size <= gates.max_answer_chars:
            continue  # a turn that calls may say nothing
        if turn["role"] == "assistant" and not gates.min_answer_chars <= size <= gates.max_answer_chars:
            return "answer_length", (f"an answer of {size} characters (min_answer_chars {gates.min_answer_chars}, "
                                     f"max_answer_chars {gates.max_answer_chars})")
    return None


class Gatekeeper:
    """The duplicate gates over the set made so far (the thread that keeps rows asks): `duplicate` names the gate
    a row fails, or None (then `keep`)."""

    def __init__(self, gates: Gates) -> None:
        self.gates = gates
        self.near = gates.near_threshold if gates.dedupe == "near" else None
        self.kept, self.against = _Index(), _Index()
        for path in gates.against:
            for row in _rows(Path(path)):
                self.against.add(text_of(row["messages"]) if isinstance(row.get("messages"), list) else _flat(row))

    def duplicate(self, messages: list[dict[str, Any]]) -> tuple[str, str] | None:
        """(gate, why) for a row that repeats a kept row or an `against` row, else None."""
        g = self.gates
        if g.dedupe == "off":
            return None
        text = text_of(messages)
        if self.kept.matches(text, self.near):
            return "duplicate", f"repeats a kept row ({g.dedupe})"
        if self.against.matches(text, self.near):
            return "against", f"repeats a row of {', '.join(Path(a).name for a in g.against)} ({g.dedupe})"
        return None

    def keep(self, messages: list[dict[str, Any]]) -> None:
        self.kept.add(text_of(messages))


def _flat(row: dict[str, Any]) -> str:
    return "\n".join(str(v) for v in row.values() if isinstance(v, str))


def _rows(path: Path) -> list[dict[str, Any]]:
    rows = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows
