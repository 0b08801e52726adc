"""Which rows a job trains on and which it holds out: the slice the user asked for, and the seeded eval split.

prepare (the package's face) and the dataset report (report.py) split alike, so a report names the rows a job
holds out.
"""

from __future__ import annotations

import math
import random
from typing import Any

from tunestudio.worker.errors import UserError


def slice_rows(rows: list[Any], start: int | None, end: int | None, what: str = "the dataset") -> list[Any]:
    """Rows start..end, both inclusive; the end clamps to the last row.

    Raises UserError when the slice starts past the last row: training on "the last row" instead would
    be a job the user did not ask for.
    """
    if not rows:
        return rows
    if start is not None and start >= len(rows):
        raise UserError(f"dataset_slice_start: the slice {start}..{'end' if end is None else end} starts past the end "
                        f"of {what}, which has {len(rows)} rows (numbered 0..{len(rows) - 1})")
    first = max(start or 0, 0)
    last = len(rows) - 1 if end is None else min(max(end, first), len(rows) - 1)
    return rows[first : last + 1]


def auto_eval_size(n_rows: int) -> int:
    """5% of the rows, clamped to 16..128; 0 when the dataset has under 32 rows."""
    if n_rows < 32:
        return 0
    return min(max(math.ceil(n_rows * 0.05), 16), 128)


def eval_size(n_rows: int, fraction: float | None) -> int:
    """The rows held out of n_rows: `auto_eval_size` without a fraction; else ceil(fraction x n_rows), at least 1
    and at most n_rows - 1 (0 when there are not two rows)."""
    if fraction is None:
        return auto_eval_size(n_rows)
    if n_rows < 2:
        return 0
    return min(max(math.ceil(n_rows * fraction), 1), n_rows - 1)


def hold_out(examples: list[Any], n_eval: int, seed: int) -> tuple[list[Any], list[Any]]:
    """(the rows kept for training, the n_eval held out), in their order: deterministic from the job's seed, so
    a resumed job sees the same split (and the dataset report names the same rows)."""
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    held = set(order[:n_eval])
    return ([e for i, e in enumerate(examples) if i not in held], [e for i, e in enumerate(examples) if i in held])
