"""A finished job's held-out rows one by one, worst first: read from the file its final evaluation wrote
(`events.EVAL_ROWS_FILE`, named in its result's evaluation), ordered and paged. No state of its own.

"Worst" is the highest loss or error rate (an audio row's WER, CER), or the lowest score of a generation metric
(exact match, token F1, ROUGE-L, and a tool row's tool-call figures: higher is better); rows without the figure (a
metric of a row that was not answered, a call figure of a row without tools) come last either way, and rows that
tie keep their held-out order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tunestudio.config.vocabulary import GENERATION_METRICS, SPEECH_METRICS, TOOL_METRICS
from tunestudio.jobs.models import Job, JobConflict
from tunestudio.jobs.status import JobStatus

__all__ = ["ORDER_KEYS", "Order", "RowsPage", "page"]

ORDER_KEYS: tuple[str, ...] = ("loss", *GENERATION_METRICS, *TOOL_METRICS, *SPEECH_METRICS)
Order = Literal["worst", "best"]


@dataclass(frozen=True)
class RowsPage:
    total: int  # every evaluated row
    ranked: int  # the rows that have the figure ordered by
    rows: list[dict[str, Any]]  # this page's
    loss: str  # what a row's loss is
    metrics: list[str]  # the generation metrics a row may carry


def page(job: Job, by: str, order: Order, limit: int, offset: int) -> RowsPage:
    """A page of `job`'s evaluated rows ordered by `by` (a key of ORDER_KEYS); JobConflict, saying why, when the
    job has no such rows."""
    body = _read(job)
    rows: list[dict[str, Any]] = body["rows"]
    has = [r for r in rows if isinstance(r.get(by), (int, float))]
    lacks = [r for r in rows if not isinstance(r.get(by), (int, float))]
    worst_is_high = by == "loss" or by in SPEECH_METRICS  # an error rate: the highest is the worst
    descending = worst_is_high == (order == "worst")
    ranked = sorted(has, key=lambda r: (-r[by] if descending else r[by], r.get("index", 0)))
    ordered = ranked + lacks
    return RowsPage(total=len(rows), ranked=len(has), rows=ordered[offset: offset + limit],
                    loss=str(body.get("loss") or ""), metrics=list(body.get("metrics") or []))


def _read(job: Job) -> dict[str, Any]:
    evaluation = (job.result or {}).get("evaluation") or {}
    path = evaluation.get("rows_file")
    if not path:
        raise JobConflict(f"job {job.id} has no evaluation rows: {_why_none(job, bool(evaluation))}")
    try:
        body = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise JobConflict(f"job {job.id}'s evaluation rows ({path}) are gone: its output folder was deleted or "
                          "moved") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise JobConflict(f"job {job.id}'s evaluation rows ({path}) cannot be read: {exc}") from None
    if not isinstance(body, dict) or not isinstance(body.get("rows"), list):
        raise JobConflict(f"job {job.id}'s evaluation rows ({path}) are not a rows file of tunestudio")
    return body


def _why_none(job: Job, evaluated: bool) -> str:
    if not job.spec.trains:
        return "it is an export; its training job has them"
    if not job.status.is_terminal:
        return f"it is {job.status.value}; the rows are measured by its final evaluation, when it completes"
    if job.status is JobStatus.stopped:
        return "it was stopped, and a stopped job is not evaluated (its resume is, when it completes)"
    if job.status is not JobStatus.completed:
        return f"it is {job.status.value}, so it was not evaluated"
    if evaluated:
        return "its evaluation did not measure rows one by one (it ran before tunestudio did)"
    return ("it held out no rows to evaluate: set eval_steps above 0 (a dataset of 32 rows or more holds rows out) "
            "or name an eval_split")
