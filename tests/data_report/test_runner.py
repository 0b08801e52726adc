"""data_report/runner.py's child: a fork of the warm worker forkserver when there is one (a server's), else a
spawned interpreter (the CLI's); the same report either way, and a memory bound on what the child alone holds
(tests/api/test_datasets_report.py and tests/worker/test_dataset_bounds.py drive the route, the CLI and the
bounds)."""

from __future__ import annotations

import json
from multiprocessing import forkserver
from pathlib import Path

import psutil
import pytest

from tunestudio.config import ReportSpec
from tunestudio.data_report import ReportTooLarge, resolved, run_report, runner
from tunestudio.jobs import prewarm

from ..helpers.start_method import record_start_method

SHARED_BOUND = 96 << 20  # bytes: more than a fork writes for this report, far less than it shares (checked below)


def test_a_report_forks_from_the_warm_forkserver_and_answers_as_a_spawned_child_does(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not prewarm.forks(True):
        pytest.skip("workers are always spawned on a machine with a GPU (jobs/prewarm.py): no fork to compare")
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

    # The memory bound counts what the fork alone holds: with a bound under half the forkserver's resident memory
    # (the libraries both hold) the report is made; with 1 MiB it is stopped.
    server = psutil.Process(forkserver._forkserver._forkserver_pid).memory_info().rss
    assert server > 4 * SHARED_BOUND, server  # the bound below is well under what the fork shares
    assert run_report(spec, max_rss=SHARED_BOUND)["usable"] == 40
    many = tmp_path / "many.jsonl"  # long enough to be watched many times
    many.write_text("".join(json.dumps({"instruction": f"say {i}", "output": str(i)}) + "\n" for i in range(3000)))
    monkeypatch.setattr(runner, "WATCH_S", 0.01)
    with pytest.raises(ReportTooLarge, match=r"more than 1 MiB of memory \(\d+ MiB when"):
        run_report(spec.model_copy(update={"local_datasets": [str(many)]}), max_rss=1 << 20)
    assert used[-2:] == ["forkserver", "forkserver"]
