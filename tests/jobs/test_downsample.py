from __future__ import annotations

import math
import random

import pytest

from tunestudio.jobs.downsample import ChartView, MinMaxStream


def test_min_max_keeps_ends_and_extremes() -> None:
    records = [{"step": i, "loss": math.sin(i / 50) + (5.0 if i == 54_321 else 0.0)} for i in range(100_000)]
    records[77_777]["loss"] = -9.0
    stream = MinMaxStream(1000, lambda r: r["loss"])
    stream.extend(records)
    view = stream.points()
    assert len(view) <= 1000
    assert view[0] is records[0] and view[-1] is records[-1]
    steps = [r["step"] for r in view]
    assert steps == sorted(steps)
    assert 54_321 in steps and 77_777 in steps  # the spike and the dip survive


def chart(index: list, max_points: int) -> list:
    view = ChartView(max_points)
    view.extend(index)
    return view.rows()


def test_chart_rows_keep_eval_points_and_respect_the_budget() -> None:
    index = [(i, i, 1 / (i + 1), None) for i in range(10_000)]
    index += [(10_000 + i, i, None, 2 / (i + 1)) for i in range(0, 10_000, 1000)]
    view = chart(index, 200)
    assert len(view) <= 200
    assert sum(r[3] is not None for r in view) == 10
    assert [r[1] for r in view] == sorted(r[1] for r in view)
    assert chart(index[:50], 200) == index[:50]


@pytest.mark.parametrize("seed", range(6))
def test_stream_keeps_ends_extremes_and_budget_at_every_length(seed: int) -> None:
    rng = random.Random(seed)
    budget = rng.choice([3, 10, 101, 1000])
    values = [rng.gauss(0, 1) if rng.random() > 0.05 else None for _ in range(rng.randint(1, 30_000))]
    stream = MinMaxStream(budget, lambda r: r[1])
    fed = 0
    while fed < len(values):  # fed in uneven chunks, read after each, as a chart polling a live job does
        chunk = rng.randint(1, 3000)
        stream.extend((i, values[i]) for i in range(fed, min(fed + chunk, len(values))))
        fed = min(fed + chunk, len(values))
        view = stream.points()
        positions = [i for i, _ in view]
        assert len(view) <= budget
        assert positions == sorted(set(positions))
        assert positions[0] == 0 and positions[-1] == fed - 1
        if fed <= budget:
            assert positions == list(range(fed))
        present = [(v, i) for i, v in enumerate(values[:fed]) if v is not None]
        if budget >= 4 and present:
            assert min(present)[1] in positions and max(present)[1] in positions
    one_shot = MinMaxStream(budget, lambda r: r[1])
    one_shot.extend(enumerate(values))
    assert one_shot.points() == stream.points()  # the same view, however it was fed
    assert len(stream.points(2)) == min(2, len(values))


def test_chart_view_follows_a_growing_job() -> None:
    view = ChartView(200)
    index = [(i + 1, i, 1 / (i + 1), None) for i in range(5000)]
    for start in range(0, 5000, 700):
        view.extend(index[start : start + 700])
    assert view.rows() == chart(index, 200)  # fed in pieces or at once, the same chart
    assert view.last == index[-1]
    assert len(view.rows()) <= 200 and view.rows()[0] == index[0] and view.rows()[-1] == index[-1]


@pytest.mark.parametrize("budget", [2, 3, 4, 5, 10, 1000])
def test_chart_view_never_exceeds_a_small_budget(budget: int) -> None:
    index = [(i + 1, i, 1 / (i + 1), None) for i in range(3000)]
    index += [(5000 + i, i, None, 1 / (i + 2)) for i in range(0, 3000, 10)]
    index.sort(key=lambda r: (r[1], r[0]))
    view = ChartView(budget)
    view.extend(index)
    rows = view.rows()
    assert len(rows) <= budget
    assert any(r[2] is not None for r in rows)  # the training curve is never squeezed out
    only_evals = ChartView(budget)
    only_evals.extend([r for r in index if r[2] is None])
    assert 0 < len(only_evals.rows()) <= budget
