"""worker/converter.py's child: what a converter prints reaches the caller, and `nice` lowers its priority."""

from __future__ import annotations

import os
import sys

import pytest

from tunestudio.worker.converter import run_child

CHILD = "import json, os; print(json.dumps({'nice': os.nice(0)}))"


@pytest.mark.parametrize("nice", [0, 10])
def test_the_child_runs_at_the_niceness_asked_above_this_process(nice: int) -> None:
    found: list[dict] = []
    run_child([sys.executable, "-c", CHILD], {}, lambda message: None, lambda: None, found=found, nice=nice)
    assert found == [{"nice": min(os.nice(0) + nice, 19)}]
