"""Token lengths as the dataset report shows them (report.py for text rows, image_report.py for rows with
images): their spread, a histogram, and what max_seq_length does to them."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

HISTOGRAM_BINS = 30


def _percentile(ordered: np.ndarray, p: float) -> int:
    """The smallest length at or under which at least p % of the rows lie (nearest rank)."""
    return int(ordered[max(1, min(len(ordered), math.ceil(p / 100 * len(ordered)))) - 1])


def summarise_lengths(lengths: np.ndarray, clipped: int, max_seq_length: int,
                      measure: int | None) -> dict[str, Any]:
    """The rows' token lengths: their spread, a histogram, and what max_seq_length does to them (`clipped`: rows
    measured only up to `measure` tokens, their lengths lower bounds)."""
    if not lengths.size:
        return {"unit": "tokens", "rows": 0, "max_seq_length": max_seq_length, "histogram": {"edges": [], "counts": []},
                "cut_rows": 0, "cut_tokens": 0, "keep_95": None, "keep_99": None, "clipped_rows": 0}
    ordered = np.sort(lengths)
    low, span = int(ordered[0]), int(ordered[-1] - ordered[0]) + 1
    width = max(1, math.ceil(span / HISTOGRAM_BINS))
    bins = math.ceil(span / width)
    over = lengths[lengths > max_seq_length] - max_seq_length
    return {
        "unit": "tokens",
        "rows": int(lengths.size),
        "min": low,
        "median": _percentile(ordered, 50),
        "mean": round(int(lengths.sum()) / lengths.size, 1),
        "max": int(ordered[-1]),
        "max_seq_length": max_seq_length,
        # bin i holds the lengths edges[i] <= n < edges[i + 1]. A row is cut when n > max_seq_length (one of
        # exactly max_seq_length tokens fits), so bin i holds only lengths that are cut exactly when
        # edges[i] > max_seq_length: the faces mark those bins (cli/data.py, report.js)
        "histogram": {"edges": [low + i * width for i in range(bins + 1)],
                      "counts": np.bincount((lengths - low) // width, minlength=bins).tolist()},
        "cut_rows": int(over.size),
        "cut_tokens": int(over.sum()),
        "keep_95": _percentile(ordered, 95),
        "keep_99": _percentile(ordered, 99),
        "measured_up_to": measure,
        "clipped_rows": clipped,
    }
