"""A finished job's held-out rows ordered and paged (jobs/evalrows.py), and why a job has none."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tunestudio.jobs.evalrows import ORDER_KEYS, page
from tunestudio.jobs.models import Job, JobConflict
from tunestudio.jobs.status import JobStatus


def job(status: JobStatus = JobStatus.completed, result: dict[str, Any] | None = None, kind: str = "train") -> Job:
    return Job(id="j1", kind=kind, status=status, config={}, created_at=time.time(), result=result)


def with_rows(tmp_path: Path, rows: list[dict[str, Any]]) -> Job:
    path = tmp_path / "eval_rows.json"
    path.write_text(json.dumps({"loss": "what it is", "metrics": ["rouge_l"], "rows": rows}))
    return job(result={"evaluation": {"rows_file": str(path)}})


ROWS = [{"index": 0, "loss": 1.0, "rouge_l": 0.5}, {"index": 1, "loss": 3.0, "rouge_l": None},
        {"index": 2, "loss": 2.0, "rouge_l": 0.0}, {"index": 3, "loss": 3.0, "rouge_l": 1.0},
        {"index": 4, "loss": None, "rouge_l": None}]


def indices(found: Any) -> list[int]:
    return [r["index"] for r in found.rows]


def test_worst_is_the_highest_loss_or_the_lowest_metric_ties_keep_their_order_and_missing_figures_come_last(
    tmp_path: Path,
) -> None:
    done = with_rows(tmp_path, ROWS)
    assert indices(page(done, "loss", "worst", 50, 0)) == [1, 3, 2, 0, 4]
    assert indices(page(done, "loss", "best", 50, 0)) == [0, 2, 1, 3, 4]
    assert indices(page(done, "rouge_l", "worst", 50, 0)) == [2, 0, 3, 1, 4]
    assert indices(page(done, "rouge_l", "best", 50, 0)) == [3, 0, 2, 1, 4]
    found = page(done, "loss", "worst", 2, 1)
    assert indices(found) == [3, 2] and (found.total, found.ranked) == (5, 4)
    assert found.loss == "what it is" and found.metrics == ["rouge_l"]
    assert page(done, "loss", "worst", 10, 9).rows == []



def test_rows_ordered_by_a_tool_call_figure_rows_without_tools_last(tmp_path: Path) -> None:
    rows = [{"index": 0, "loss": 1.0, "tool_args": 1.0}, {"index": 1, "loss": 1.0},
            {"index": 2, "loss": 1.0, "tool_args": 0.0}, {"index": 3, "loss": 1.0, "tool_args": None}]
    assert indices(page(with_rows(tmp_path, rows), "tool_args", "worst", 50, 0)) == [2, 0, 1, 3]
    assert {"tool_choice", "tool_name", "tool_args", "tool_arg_match"} <= set(ORDER_KEYS)  # GET .../rows?by= takes them

@pytest.mark.parametrize(("status", "result", "kind", "why"), [
    (JobStatus.training, None, "train", "it is training; the rows are measured by its final evaluation, when it "
                                        "completes"),
    (JobStatus.stopped, {}, "train", "it was stopped, and a stopped job is not evaluated (its resume is, when it "
                                     "completes)"),
    (JobStatus.failed, None, "train", "it is failed, so it was not evaluated"),
    (JobStatus.completed, {"evaluation": None}, "train", "it held out no rows to evaluate: set eval_steps above 0 "
                                                         "(a dataset of 32 rows or more holds rows out) or name an "
                                                         "eval_split"),
    (JobStatus.completed, {"evaluation": {"rows": 3}}, "train", "its evaluation did not measure rows one by one (it "
                                                                "ran before tunestudio did)"),
    (JobStatus.completed, None, "export", "it is an export; its training job has them"),
])
def test_a_job_without_rows_says_why(status: JobStatus, result: dict | None, kind: str, why: str) -> None:
    with pytest.raises(JobConflict) as caught:
        page(job(status, result, kind), "loss", "worst", 10, 0)
    assert str(caught.value) == f"job j1 has no evaluation rows: {why}"


def test_rows_whose_file_is_gone_or_not_ours_say_so(tmp_path: Path) -> None:
    gone = job(result={"evaluation": {"rows_file": str(tmp_path / "nope.json")}})
    with pytest.raises(JobConflict, match="are gone: its output folder was deleted or moved"):
        page(gone, "loss", "worst", 10, 0)
    (tmp_path / "odd.json").write_text("[1, 2]")
    odd = job(result={"evaluation": {"rows_file": str(tmp_path / "odd.json")}})
    with pytest.raises(JobConflict, match="are not a rows file of tunestudio"):
        page(odd, "loss", "worst", 10, 0)
