from __future__ import annotations

import math

from tunestudio.jobs.downsample import chart_view, min_max


def test_min_max_keeps_ends_and_extremes() -> None:
    records = [{"step": i, "loss": math.sin(i / 50) + (5.0 if i == 54_321 else 0.0)} for i in range(100_000)]
    records[77_777]["loss"] = -9.0
    view = min_max(records, 1000, "loss")
    assert len(view) <= 1000
    assert view[0] is records[0] and view[-1] is records[-1]
    steps = [r["step"] for r in view]
    assert steps == sorted(steps)
    assert 54_321 in steps and 77_777 in steps  # the spike and the dip survive


def test_chart_view_keeps_eval_points_and_respects_the_budget() -> None:
    records = [{"step": i, "loss": 1 / (i + 1), "eval_loss": None} for i in range(10_000)]
    records += [{"step": i, "loss": None, "eval_loss": 2 / (i + 1)} for i in range(0, 10_000, 1000)]
    view = chart_view(records, 200)
    assert len(view) <= 200
    assert sum(r["eval_loss"] is not None for r in view) == 10
    assert chart_view(records[:50], 200) == records[:50]
