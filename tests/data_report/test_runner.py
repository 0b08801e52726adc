"""data_report/runner.py's child: a fork of the warm worker forkserver when there is one (a server's), else a
spawned interpreter (the CLI's); the same report either way, and the same memory bound (tests/api/
test_datasets_report.py and tests/worker/test_dataset_bounds.py drive the route, the CLI and the bounds)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tunestudio.config import ReportSpec
from tunestudio.data_report import ReportTooLarge, resolved, run_report, runner
from tunestudio.jobs import prewarm

from ..helpers.start_method import record_start_method


def test_a_report_forks_from_the_warm_forkserver_and_answers_as_a_spawned_child_does(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"instruction": f"say {i}", "output": str(i % 3)}) + "\n" for i in range(40))
                    + "not json\n")
    spec = resolved(ReportSpec.model_validate({"local_datasets": [str(rows)], "model_name": str(tiny_model)}))
    used: list[str] = []
    record_start_method(monkeypatch, used, cold=True)
    spawned = run_report(spec)
    prewarm.warm_up().join(120)  # the forkserver warm: its preload done, its first fork returned
    record_start_method(monkeypatch, used, cold=False)
    forked = run_report(spec)
    assert used == ["spawn", "forkserver"]
    assert forked.pop("seconds") >= 0 and spawned.pop("seconds") >= 0  # how long each took: the one difference
    assert forked == spawned
    assert forked["usable"] == 40 and forked["refused_count"] == 1 and forked["lengths"] is not None, forked
    # The bound holds for a fork too: what it holds beyond the pages it shares with the forkserver is counted.
    monkeypatch.setattr(runner, "WATCH_S", 0.01)
    with pytest.raises(ReportTooLarge, match=r"more than 0\.0 GiB"):
        run_report(spec, max_rss=1 << 20)
    assert used[-1] == "forkserver"
