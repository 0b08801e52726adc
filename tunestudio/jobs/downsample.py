"""Downsampling metric histories for charts.

A 100k-step job must come back as at most `max_points` records that still
show what happened: the first and the last record, and in every bucket of
consecutive records the one with the lowest and the one with the highest
value (min/max decimation, the usual choice for loss curves: spikes survive).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def min_max(records: Sequence[dict[str, Any]], max_points: int, key: str) -> list[dict[str, Any]]:
    """At most `max_points` records (>= 2 kept when there are that many), in their original order."""
    n = len(records)
    if max_points <= 0 or n <= max_points:
        return list(records)
    if max_points < 4:
        return [records[0], records[-1]][:max_points]
    inner = records[1:-1]
    buckets = (max_points - 2) // 2
    keep: list[int] = []
    size = len(inner) / buckets
    for b in range(buckets):
        lo, hi = int(b * size), int((b + 1) * size)
        if hi <= lo:
            continue
        window = range(lo, hi)
        values = [inner[i].get(key) for i in window]
        present = [(v, i) for v, i in zip(values, window, strict=True) if v is not None]
        if not present:
            keep.append(lo)
            continue
        low = min(present)[1]
        high = max(present)[1]
        keep.extend(sorted({low, high}))
    return [records[0], *(inner[i] for i in keep), records[-1]]


def chart_view(records: Sequence[dict[str, Any]], max_points: int | None) -> list[dict[str, Any]]:
    """Training records decimated on loss, eval records on eval_loss, merged by step."""
    if not max_points or len(records) <= max_points:
        return list(records)
    train = [r for r in records if r.get("loss") is not None]
    evals = [r for r in records if r.get("loss") is None]
    eval_budget = min(len(evals), max(max_points // 4, 2))
    evals = min_max(evals, eval_budget, "eval_loss")
    train = min_max(train, max_points - len(evals), "loss")
    return sorted([*train, *evals], key=lambda r: r["step"])
