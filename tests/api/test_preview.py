"""api/preview.py's child: a fork of the warm worker forkserver when there is one, else a spawned interpreter;
the same answer either way (tests/api/test_datasets_preview*.py and the page's tests drive the route)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tunestudio.api import preview
from tunestudio.jobs import prewarm

from ..helpers.start_method import record_start_method


def test_a_preview_forks_from_the_warm_forkserver_and_answers_as_a_spawned_child_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not prewarm.forks(True):
        pytest.skip("workers are always spawned on a machine with a GPU (jobs/prewarm.py): no fork to compare")
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"instruction": f"say {i}", "output": str(i)}) + "\n" for i in range(5))
                    + "not json\n")
    config = {"local_datasets": [str(rows)]}
    used: list[str] = []
    record_start_method(monkeypatch, used, cold=True)
    spawned = preview.preview_rows(config, 3)
    prewarm.warm_up().join(120)  # the forkserver warm: its preload done, its first fork returned
    record_start_method(monkeypatch, used, cold=False)
    forked = preview.preview_rows(config, 3)
    assert used == ["spawn", "forkserver"]
    assert forked == spawned and "error" not in forked, forked
    assert [row["number"] for row in forked["rows"]] == [1, 2, 3], forked
