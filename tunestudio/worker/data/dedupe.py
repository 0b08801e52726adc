"""Duplicate rows: exact (the same after normalising whitespace) and near (MinHash LSH, `minhash.py`).

One definition for the job (`JobConfig.dedupe`, applied to the usable rows before the eval split) and the
dataset report (`worker/data/report.py`), so the report counts exactly the rows a job removes.

- exact: two examples are the same once every string in them has its runs of whitespace made one space and
  its ends stripped (case and punctuation count). Rows are compared by a 64-bit BLAKE2b hash of that
  normalised content: two different contents share one with a chance of about n² / 2⁶⁵ (1 in 36 million for
  a million rows).
- near: the estimated Jaccard similarity of their word 3-gram sets (over all the example's text in reading
  order, casefolded, with punctuation and spacing not counted: `minhash.words`) is at least NEAR_THRESHOLD,
  estimated from NUM_PERM MinHash permutations; LSH finds the candidates, and each candidate is checked
  against the threshold. Which rows are near duplicates is decided in row order: a row is a near duplicate
  of the first earlier row it matches that is itself kept.

Per row, the state is a hash and a signature in numpy arrays (`Duplicates`), so a million rows take a few
hundred megabytes, not a Python object each.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from tunestudio.worker.data import minhash
from tunestudio.worker.data.minhash import NEAR_THRESHOLD, NUM_PERM, SHINGLE_WORDS, Signed

__all__ = ["NEAR_THRESHOLD", "NUM_PERM", "SHINGLE_WORDS", "Duplicates", "Mode", "content_hash", "dedupe",
           "describe", "exact_key", "find", "find_among", "text_of"]

Mode = Literal["off", "exact", "near"]
BATCH = 4096  # examples whose signatures are made at once


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


def content_hash(example: dict[str, Any]) -> int:
    """The 64-bit hash of `exact_key`: what exact duplicates share."""
    return int.from_bytes(hashlib.blake2b(exact_key(example).encode(), digest_size=8).digest(), "little")


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


@dataclass
class Duplicates:
    """Duplicates among rows 0..n-1: each later copy points at the earlier row it repeats."""

    hashes: np.ndarray  # each row's content_hash (uint64)
    first: np.ndarray  # each row's first row with the same normalised content (itself when it is the first)
    near_of: np.ndarray  # each row's earlier kept row that it nearly repeats, -1 for none
    similarity: np.ndarray  # the estimated similarity to near_of (0 where none)
    signed: Signed | None  # each row's signature (with near), for later look-ups

    @property
    def copies(self) -> np.ndarray:
        """Whether each row is an exact copy of an earlier row."""
        return self.first != np.arange(len(self.first))

    @property
    def exact(self) -> dict[int, int]:
        """row → the first row with its content, for the exact copies."""
        return {int(i): int(self.first[i]) for i in np.flatnonzero(self.copies)}

    @property
    def near(self) -> dict[int, tuple[int, float]]:
        """row → (the earlier kept row it nearly repeats, the similarity), in row order."""
        return {int(i): (int(self.near_of[i]), float(self.similarity[i])) for i in np.flatnonzero(self.near_of >= 0)}

    def removed(self, mode: Mode) -> np.ndarray:
        """Whether `dedupe: mode` removes each row (near removes the exact duplicates too)."""
        if mode == "off":
            return np.zeros(len(self.first), bool)
        return self.copies | (self.near_of >= 0) if mode == "near" else self.copies


def find_among(hashes: np.ndarray, signed: Signed | None) -> Duplicates:
    """The exact duplicates among rows with these content hashes and, given their signatures, the near
    duplicates among the rest."""
    n = len(hashes)
    first = np.arange(n)
    if n:
        _, index, inverse = np.unique(hashes, return_index=True, return_inverse=True)  # index: first occurrences
        first = index[inverse.reshape(-1)]
    near_of, similarity = np.full(n, -1, np.int64), np.zeros(n, np.float32)
    if signed is not None:
        near_of, similarity = minhash.near_duplicates(signed, first == np.arange(n))
    return Duplicates(hashes, first, near_of, similarity, signed)


def signatures_of(examples: Sequence[dict[str, Any]]) -> Signed:
    signed = Signed()
    for start in range(0, len(examples), BATCH):
        signed.append(*minhash.signatures([text_of(e) for e in examples[start:start + BATCH]]))
    return signed


def find(examples: Sequence[dict[str, Any]], near: bool) -> Duplicates:
    """The exact duplicates among `examples` and, if `near`, the near duplicates among the rest."""
    hashes = np.fromiter(map(content_hash, examples), np.uint64, len(examples))
    return find_among(hashes, signatures_of(examples) if near else None)


def dedupe(examples: list[dict[str, Any]], mode: Mode) -> tuple[list[dict[str, Any]], int]:
    """The examples without the duplicates `mode` removes (the first of each kept, order kept), and how many went."""
    if mode == "off" or not examples:
        return examples, 0
    gone = find(examples, near=mode == "near").removed(mode)
    return [e for e, out in zip(examples, gone.tolist(), strict=True) if not out], int(gone.sum())


def describe(mode: Mode, removed: int, total: int) -> str:
    """The job's log line for what dedupe did."""
    how = ("exact duplicates (the same after normalising whitespace)" if mode == "exact" else
           f"exact and near duplicates (MinHash LSH, word {SHINGLE_WORDS}-grams of the text casefolded without "
           f"punctuation, Jaccard ≥ {NEAR_THRESHOLD})")
    return f"dedupe {mode}: removed {removed} of {total} rows as {how}; the first of each is kept"


def method() -> str:
    """How near duplicates are found, for the report."""
    return (f"MinHash LSH, {NUM_PERM} permutations, word {SHINGLE_WORDS}-grams of the text casefolded with "
            f"punctuation and spacing not counted, estimated Jaccard ≥ {NEAR_THRESHOLD}")
