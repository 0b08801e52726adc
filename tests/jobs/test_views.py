"""Metric views: cached per (job, max_points, since_step), extended with new rows, bounded."""

from __future__ import annotations

from pathlib import Path

from tunestudio.jobs.store import Store
from tunestudio.jobs.views import MetricViews


def _rows(start: int, stop: int) -> list[tuple[int, dict]]:
    return [(step, {"step": step, "total_steps": 1000, "loss": 1.0 / step, "ts": float(step)})
            for step in range(start, stop)]


def test_a_view_is_cached_extended_and_bounded(tmp_path: Path) -> None:
    store = Store(tmp_path / "db.sqlite")
    try:
        store.insert_job({"id": "j", "status": "training", "config": {}, "created_at": 0.0})
        store.append("j", metrics=_rows(1, 501), last_seq=500)
        views = MetricViews(store, max_records=300, max_views=3)
        first = views.records("j", 500, 50, None)
        assert len(first) <= 50 and first[0]["step"] == 1 and first[-1]["step"] == 500
        assert views.records("j", 500, 50, None) is first  # same seq: the cached answer
        store.append("j", metrics=_rows(501, 601), last_seq=600)
        grown = views.records("j", 600, 50, None)
        assert grown[-1]["step"] == 600 and len(grown) <= 50
        assert [r["step"] for r in views.records("j", 600, None, 590)] == list(range(591, 601))
        for points in (10, 20, 30):
            views.records("j", 600, points, None)
        count, held = views.held()
        assert count <= 3 and held <= 300
        views.drop("j")
        assert views.held() == (0, 0)
        views.records("j", 600, 10, None)
        views.clear()
        assert views.keys() == []
    finally:
        store.close()
