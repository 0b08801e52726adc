"""Duplicate rows: exact (the same after normalising whitespace) and near (MinHash LSH, `datasketch`).

One definition for the job (`JobConfig.dedupe`, applied to the usable rows before the eval split) and the
dataset report (`worker/data/report.py`), so the report counts exactly the rows a job removes.

- exact: two examples are the same once every string in them has its runs of whitespace made one space and
  its ends stripped (case and punctuation count).
- near: the estimated Jaccard similarity of their word 3-gram sets (lower-cased, whitespace-split, over all
  the example's text in reading order) is at least NEAR_THRESHOLD, estimated from NUM_PERM MinHash
  permutations; LSH finds the candidates, and each candidate is checked against the threshold. Which rows
  are near duplicates is decided in row order: a row is a near duplicate of the first earlier row it matches
  that is itself kept.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

NEAR_THRESHOLD = 0.8
NUM_PERM = 128
SHINGLE_WORDS = 3  # shingles() spells out three
_SEED = 1  # the MinHash permutations: fixed, so a job and its report decide alike
Mode = Literal["off", "exact", "near"]


def _normalised(value: Any) -> Any:
    if isinstance(value, str):
        return " ".join(value.split())
    if isinstance(value, list):
        return [_normalised(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _normalised(v) for k, v in value.items()}
    return value


def exact_key(example: dict[str, Any]) -> str:
    """What two examples share exactly when they are the same after normalising whitespace."""
    return json.dumps(_normalised(example), sort_keys=True, ensure_ascii=False, default=str)


def text_of(example: dict[str, Any]) -> str:
    """All of an example's text in reading order: strings as they are, conversation turns as 'role: content'."""
    parts: list[str] = []
    for value in example.values():
        if isinstance(value, str):
            parts.append(value)
        elif isinstance(value, list):
            for turn in value:
                if isinstance(turn, dict) and isinstance(turn.get("content"), str):
                    parts.append(f"{turn.get('role', '')}: {turn['content']}")
    return "\n".join(parts)


def shingles(text: str) -> list[bytes]:
    """The word 3-grams of a text (lower-cased); a text of fewer words is one shingle, an empty one none."""
    words = text.lower().split()
    if len(words) <= SHINGLE_WORDS:
        return [" ".join(words).encode()] if words else []
    return [f"{a} {b} {c}".encode() for a, b, c in set(zip(words, words[1:], words[2:], strict=False))]


def signatures(texts: Iterable[str]) -> list[Any | None]:
    """One MinHash per text (None for a text without words), with shared permutations."""
    from datasketch import MinHash

    empty = MinHash(num_perm=NUM_PERM, seed=_SEED, hashfunc=zlib.crc32)
    out: list[Any | None] = []
    for text in texts:
        grams = shingles(text)
        if not grams:
            out.append(None)
            continue
        signature = empty.copy()
        signature.update_batch(grams)
        out.append(signature)
    return out


class NearIndex:
    """Signatures by row, to look one up against: the earliest allowed row at or above the threshold."""

    def __init__(self, signed: Iterable[tuple[int, Any]]) -> None:
        from datasketch import MinHashLSH

        self._lsh = MinHashLSH(threshold=NEAR_THRESHOLD, num_perm=NUM_PERM)
        self._held: dict[int, Any] = {}
        with self._lsh.insertion_session() as session:
            for key, signature in signed:
                if signature is not None:
                    session.insert(key, signature, check_duplication=False)
                    self._held[key] = signature

    def match(self, signature: Any, allowed: Callable[[int], bool]) -> tuple[int, float] | None:
        """(the earliest allowed row whose estimated similarity reaches the threshold, that similarity), or None."""
        if signature is None:
            return None
        best: tuple[int, float] | None = None
        for key in self._lsh.query(signature):
            if (best is None or key < best[0]) and allowed(key):
                similarity = signature.jaccard(self._held[key])
                if similarity >= NEAR_THRESHOLD:
                    best = (key, similarity)
        return best


@dataclass
class Duplicates:
    """Duplicates among rows 0..n-1: each later copy points at the earlier row it repeats."""

    exact: dict[int, int] = field(default_factory=dict)  # row → the first row with the same normalised content
    near: dict[int, tuple[int, float]] = field(default_factory=dict)  # row → (earlier kept row, similarity)
    index: NearIndex | None = None  # every row that is no exact copy (with near=True), for later look-ups
    keys: list[str] = field(default_factory=list)  # each row's exact_key

    def removed(self, mode: Mode) -> set[int]:
        """The rows `dedupe: mode` removes (near removes the exact duplicates too)."""
        if mode == "off":
            return set()
        return set(self.exact) | (set(self.near) if mode == "near" else set())


def find(examples: Sequence[dict[str, Any]], near: bool, signed: Sequence[Any | None] | None = None) -> Duplicates:
    """The exact duplicates among `examples` and, if `near`, the near duplicates among the rest.

    `signed`: the examples' signatures when the caller already has them (same order).
    """
    found = Duplicates()
    first: dict[str, int] = {}
    found.keys = [exact_key(example) for example in examples]
    for i, key in enumerate(found.keys):
        if key in first:
            found.exact[i] = first[key]
        else:
            first[key] = i
    if not near:
        return found
    if signed is None:
        signed = signatures(text_of(e) if i not in found.exact else "" for i, e in enumerate(examples))
    found.index = NearIndex((i, s) for i, s in enumerate(signed) if i not in found.exact)
    for i, signature in enumerate(signed):
        if i not in found.exact:
            # a row matches an earlier row that is itself kept (decided already: rows go in order)
            match = found.index.match(signature, lambda key, i=i: key < i and key not in found.near)
            if match is not None:
                found.near[i] = match
    return found


def dedupe(examples: list[dict[str, Any]], mode: Mode) -> tuple[list[dict[str, Any]], int]:
    """The examples without the duplicates `mode` removes (the first of each kept, order kept), and how many went."""
    if mode == "off" or not examples:
        return examples, 0
    gone = find(examples, near=mode == "near").removed(mode)
    return [e for i, e in enumerate(examples) if i not in gone], len(gone)


def describe(mode: Mode, removed: int, total: int) -> str:
    """The job's log line for what dedupe did."""
    how = ("exact duplicates (the same after normalising whitespace)" if mode == "exact" else
           f"exact and near duplicates (MinHash LSH, word {SHINGLE_WORDS}-grams, Jaccard ≥ {NEAR_THRESHOLD})")
    return f"dedupe {mode}: removed {removed} of {total} rows as {how}; the first of each is kept"
