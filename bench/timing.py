"""Timing helpers the benchmark scripts share."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100): the smallest value with at least p % of the values at or below it."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(p / 100 * len(ordered))))
    return ordered[rank - 1]


def time_calls(fn: Callable[[], Any], calls: int, max_seconds: float) -> list[float]:
    """Milliseconds per call of fn, after one warm-up call: `calls` of them, or fewer if max_seconds pass first."""
    fn()
    ms: list[float] = []
    start = time.monotonic()
    while len(ms) < calls and time.monotonic() - start < max_seconds:
        t0 = time.perf_counter()
        fn()
        ms.append((time.perf_counter() - t0) * 1000)
    return ms
