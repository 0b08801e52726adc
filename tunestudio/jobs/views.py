"""Metric views: a job's metric records, downsampled for a chart, cached and brought up to date.

A view is kept per (job, max_points, since_step) and extended with the rows
added since it was built: a chart polling a live 100k-step job pays for the
new rows only, and one polling a finished job gets the cached answer. The
cache is bounded by the records it holds and by its number of views, least
recently used out first.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from tunestudio.jobs.downsample import ChartView
from tunestudio.jobs.store import Store

VIEW_RECORDS = 50_000  # metric records the cached views may hold together (~50 MB) ...
MAX_VIEWS = 256  # ... and how many views there may be


@dataclass
class _View:
    """A metrics answer as of event `seq`, and the chart it came from (None: not downsampled)."""

    seq: int
    chart: ChartView | None
    records: list[dict[str, Any]]
    by_rowid: dict[int, dict[str, Any]]  # the chart's records by metrics rowid


class MetricViews:
    def __init__(self, store: Store, max_records: int | None = None, max_views: int | None = None) -> None:
        self.store = store
        self.max_records = max_records or VIEW_RECORDS
        self.max_views = max_views or MAX_VIEWS
        self._views: dict[tuple[str, int | None, int | None], _View] = {}  # least recently used first
        self._lock = threading.Lock()

    def records(self, job_id: str, seq: int, max_points: int | None, since_step: int | None) -> list[dict]:
        """The job's metric records as of stream event `seq`, newer than since_step, at most ~max_points."""
        key = (job_id, max_points, since_step)
        with self._lock:
            cached = self._views.pop(key, None)
            if cached is not None and cached.seq == seq:
                self._views[key] = cached  # most recently used last
                return cached.records
            self.store.flush()
            chart = None
            by_rowid: dict[int, dict[str, Any]] = {}
            if not max_points:
                records = self.store.metrics(job_id, since_step)
            else:
                chart = cached.chart if cached is not None and cached.chart is not None else ChartView(max_points)
                after = (chart.last[1], chart.last[0]) if chart.last is not None else None
                chart.extend(self.store.metric_index(job_id, since_step, after=after))
                rowids = [row[0] for row in chart.rows()]
                known = cached.by_rowid if cached is not None else {}  # most chosen rows were chosen last time
                by_rowid = {r: known[r] for r in rowids if r in known}
                by_rowid.update(self.store.metric_rows([r for r in rowids if r not in by_rowid]))
                records = [by_rowid[r] for r in rowids if r in by_rowid]  # (a row may be deleted meanwhile)
            self._views[key] = _View(seq, chart, records, by_rowid)
            self._trim()
        return records

    def _trim(self) -> None:
        """Drop least recently used views past either bound; the newest always stays."""
        while len(self._views) > 1 and (
            len(self._views) > self.max_views
            or sum(max(1, len(v.records)) for v in self._views.values()) > self.max_records
        ):
            self._views.pop(next(iter(self._views)))

    def drop(self, job_id: str) -> None:
        """Forget every view of one job (it was deleted)."""
        with self._lock:
            for key in [k for k in self._views if k[0] == job_id]:
                del self._views[key]

    def clear(self) -> None:
        with self._lock:
            self._views.clear()

    def held(self) -> tuple[int, int]:
        """(views, records) the cache holds now."""
        with self._lock:
            return len(self._views), sum(len(v.records) for v in self._views.values())

    def keys(self) -> list[tuple[str, int | None, int | None]]:
        with self._lock:
            return list(self._views)
