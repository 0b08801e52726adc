from __future__ import annotations

import math

from tunestudio.jobs.downsample import chart_rows, min_max


def test_min_max_keeps_ends_and_extremes() -> None:
    records = [{"step": i, "loss": math.sin(i / 50) + (5.0 if i == 54_321 else 0.0)} for i in range(100_000)]
    records[77_777]["loss"] = -9.0
    view = min_max(records, 1000, lambda r: r["loss"])
    assert len(view) <= 1000
    assert view[0] is records[0] and view[-1] is records[-1]
    steps = [r["step"] for r in view]
    assert steps == sorted(steps)
    assert 54_321 in steps and 77_777 in steps  # the spike and the dip survive


def test_chart_rows_keep_eval_points_and_respect_the_budget() -> None:
    index = [(i, i, 1 / (i + 1), None) for i in range(10_000)]
    index += [(10_000 + i, i, None, 2 / (i + 1)) for i in range(0, 10_000, 1000)]
    view = chart_rows(index, 200)
    assert len(view) <= 200
    assert sum(r[3] is not None for r in view) == 10
    assert [r[1] for r in view] == sorted(r[1] for r in view)
    assert chart_rows(index[:50], 200) == index[:50]
