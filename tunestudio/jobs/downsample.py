"""Downsampling metric histories for charts.

A 100k-step job must come back as at most `max_points` records that still
show what happened: the first and the last record, and in every bucket of
consecutive records the one with the lowest and the one with the highest
value (min/max decimation, the usual choice for loss curves: spikes survive).
The choice works on light tuples; only the chosen records are read in full.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def min_max(items: Sequence[T], max_points: int, value: Callable[[T], Any]) -> list[T]:
    """At most `max_points` items (the first and last always), in their original order."""
    n = len(items)
    if max_points <= 0 or n <= max_points:
        return list(items)
    if max_points < 4:
        return [items[0], items[-1]][:max_points]
    inner = items[1:-1]
    buckets = (max_points - 2) // 2
    size = len(inner) / buckets
    keep: list[int] = []
    for b in range(buckets):
        lo, hi = int(b * size), int((b + 1) * size)
        if hi <= lo:
            continue
        present = [(v, i) for i in range(lo, hi) if (v := value(inner[i])) is not None]
        if not present:
            keep.append(lo)
            continue
        keep.extend(sorted({min(present)[1], max(present)[1]}))
    return [items[0], *(inner[i] for i in keep), items[-1]]


# An index row: (rowid, step, loss, eval_loss), as Store.metric_index gives it.
Index = tuple[int, int, Any, Any]


def chart_rows(index: Sequence[Index], max_points: int | None) -> list[Index]:
    """Training rows decimated on loss, eval rows on eval_loss, merged back in step order."""
    if not max_points or len(index) <= max_points:
        return list(index)
    train = [r for r in index if r[2] is not None]
    evals = [r for r in index if r[2] is None]
    evals = min_max(evals, min(len(evals), max(max_points // 4, 2)), lambda r: r[3])
    train = min_max(train, max_points - len(evals), lambda r: r[2])
    return sorted([*train, *evals], key=lambda r: (r[1], r[0]))
