"""api/preview.py's child: a fork of the warm worker forkserver when there is one, else a spawned interpreter;
the same answer either way (tests/api/test_datasets_preview*.py and the page's tests drive the route)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import tunestudio.jobs
from tunestudio.api import preview
from tunestudio.jobs import prewarm


def test_a_preview_forks_from_the_warm_forkserver_and_answers_as_a_spawned_child_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"instruction": f"say {i}", "output": str(i)}) + "\n" for i in range(5))
                    + "not json\n")
    config = {"local_datasets": [str(rows)]}
    used: list[str] = []
    warm = tunestudio.jobs.warm_context

    def watched(cold: bool) -> Any:
        ctx = None if cold else warm()
        used.append(ctx.get_start_method() if ctx is not None else "spawn")
        return ctx

    monkeypatch.setattr(tunestudio.jobs, "warm_context", lambda: watched(cold=True))
    spawned = preview.preview_rows(config, 3)
    prewarm.warm_up().join(120)  # the forkserver warm: its preload done, its first fork returned
    monkeypatch.setattr(tunestudio.jobs, "warm_context", lambda: watched(cold=False))
    forked = preview.preview_rows(config, 3)
    assert used == ["spawn", "forkserver"]
    assert forked == spawned and "error" not in forked, forked
    assert [row["number"] for row in forked["rows"]] == [1, 2, 3], forked
