"""Downsampling metric histories for charts, as they grow.

A 100k-step job must come back as at most `max_points` records that still
show what happened: the first and the last record, and in every bucket of
consecutive records the one with the lowest and the one with the highest
value (min/max decimation, the usual choice for loss curves: spikes survive).

The decimation is incremental. A `MinMaxStream` takes records one by one into
buckets of `cap` consecutive records, each remembering its minimum and its
maximum; when the kept points outgrow the budget, neighbouring buckets merge
(cap doubles), which keeps exact minima and maxima. Reading costs O(budget),
so a chart polling a live job pays for the new records only. The choice works
on light tuples; only the chosen records are read in full.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class _Bucket:
    """Consecutive records of a series: how many, and the first, lowest and highest of them as (pos, record)."""

    __slots__ = ("count", "first", "hi", "hi_value", "lo", "lo_value")

    def __init__(self, first: tuple[int, Any]) -> None:
        self.first = first
        self.lo: tuple[int, Any] | None = None
        self.hi: tuple[int, Any] | None = None
        self.lo_value: Any = None
        self.hi_value: Any = None
        self.count = 0

    def kept(self) -> list[tuple[int, Any]]:
        if self.lo is None or self.hi is None:  # no value in this bucket: its first record keeps the x axis whole
            return [self.first]
        if self.lo[0] == self.hi[0]:
            return [self.lo]
        return [self.lo, self.hi] if self.lo[0] < self.hi[0] else [self.hi, self.lo]

    def merged(self, other: _Bucket) -> _Bucket:
        out = _Bucket(self.first)
        out.count = self.count + other.count
        for b in (self, other):
            if b.lo is not None and (out.lo is None or b.lo_value < out.lo_value):
                out.lo, out.lo_value = b.lo, b.lo_value
            if b.hi is not None and (out.hi is None or b.hi_value > out.hi_value):
                out.hi, out.hi_value = b.hi, b.hi_value
        return out


def _halve(buckets: list[_Bucket]) -> list[_Bucket]:
    pairs = [buckets[i].merged(buckets[i + 1]) for i in range(0, len(buckets) - 1, 2)]
    return pairs + buckets[-1:] if len(buckets) % 2 else pairs


def _kept(buckets: list[_Bucket]) -> int:
    return sum(len(b.kept()) for b in buckets)


class MinMaxStream(Generic[T]):
    """A growing series, decimated to at most `budget` points (the first and last always), in arrival order.

    Memory is O(budget): a bucket holds its three chosen records, never all of them.
    """

    def __init__(self, budget: int, value: Callable[[T], Any]) -> None:
        self.budget = max(budget, 1)
        self._value = value
        self._buckets: list[_Bucket] = []
        self._cap = 1  # records per bucket; doubles at each merge
        self._kept = 0  # _kept(self._buckets), kept up to date as records arrive
        self._first: tuple[int, T] | None = None
        self._last: tuple[int, T] | None = None
        self.count = 0

    def extend(self, items: Iterable[T]) -> None:
        value = self._value
        for item in items:
            entry = (self.count, item)
            self.count += 1
            if self._first is None:
                self._first = entry
            self._last = entry
            bucket = self._buckets[-1] if self._buckets else None
            if bucket is None or bucket.count >= self._cap:
                bucket = _Bucket(entry)
                self._buckets.append(bucket)
                before = 0
            else:
                before = len(bucket.kept())
            bucket.count += 1
            v = value(item)
            if v is not None:
                if bucket.lo is None or v < bucket.lo_value:
                    bucket.lo, bucket.lo_value = entry, v
                if bucket.hi is None or v > bucket.hi_value:
                    bucket.hi, bucket.hi_value = entry, v
            self._kept += len(bucket.kept()) - before
            # Up to `budget` records everything is kept; past it, merge until the points (+ the two ends) fit.
            while self.count > self.budget and self._kept + 2 > self.budget and len(self._buckets) > 1:
                self._buckets = _halve(self._buckets)
                self._cap *= 2
                self._kept = _kept(self._buckets)

    def points(self, budget: int | None = None) -> list[T]:
        """The kept records in arrival order; with a smaller `budget`, fewer (buckets merged on a copy)."""
        if self._first is None or self._last is None:
            return []
        budget = self.budget if budget is None else max(budget, 1)
        buckets = self._buckets
        if self.count > budget:
            while len(buckets) > 1 and _kept(buckets) + 2 > budget:
                buckets = _halve(buckets)
        if budget == 1 or self.count == 1:
            return [self._first[1]]
        inner = dict(entry for b in buckets for entry in b.kept())
        inner.pop(self._first[0], None)
        inner.pop(self._last[0], None)
        kept = [inner[pos] for pos in sorted(inner)][: budget - 2]
        return [self._first[1], *kept, self._last[1]]


# An index row: (rowid, step, loss, eval_loss), as Store.metric_index gives it.
Index = tuple[int, int, Any, Any]


class ChartView:
    """One job's chart, kept up to date: training rows decimated on loss, eval rows on eval_loss.

    Feed it the job's index rows in step order (`extend`); `rows()` merges
    both series back in step order, within `max_points`, eval rows taking at
    most a quarter of the points when there is not room for all.
    """

    def __init__(self, max_points: int) -> None:
        self.max_points = max_points
        self.train: MinMaxStream[Index] = MinMaxStream(max_points, lambda r: r[2])
        self.evals: MinMaxStream[Index] = MinMaxStream(max_points, lambda r: r[3])
        self.last: Index | None = None  # the newest row fed in: where the next read continues

    def extend(self, rows: Iterable[Index]) -> None:
        rows = list(rows)
        if not rows:
            return
        self.train.extend(r for r in rows if r[2] is not None)
        self.evals.extend(r for r in rows if r[2] is None)
        self.last = rows[-1]

    def rows(self) -> list[Index]:
        evals = self.evals.points()
        train = self.train.points()
        if len(train) + len(evals) > self.max_points:
            # A quarter of the points for the eval rows (at least two, when there is room for two and a train row).
            share = max(self.max_points // 4, 2) if self.max_points >= 4 else self.max_points - bool(train)
            evals = self.evals.points(min(len(evals), share)) if share > 0 else []
            train = self.train.points(self.max_points - len(evals)) if train else []
        return sorted([*train, *evals], key=lambda r: (r[1], r[0]))
