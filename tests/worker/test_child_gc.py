"""A worker's imports are out of the garbage collector's sight (worker/child.py `freeze_imports`), and what it makes
after is still collected. bench/worker_gc.py measures what it saves on the real path (a job forked from the
forkserver)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tunestudio.worker.child import GC_FREEZE_ENV

SCRIPT = """
import gc, json, sys
if sys.argv[1] == "torch":
    import torch  # the largest of a worker's imports (the forkserver's preload adds transformers, trl, peft)
from tunestudio.worker.child import freeze_imports
tracked = len(gc.get_objects())
freeze_imports()
frozen = gc.get_freeze_count()
class Node:
    pass
a, b = Node(), Node()
a.other, b.other = b, a  # a cycle made after the freeze: only the collector frees it
del a, b
print(json.dumps({"tracked": tracked, "frozen": frozen, "collected": gc.collect()}))
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("setting", [None, "0"])
def test_a_worker_s_imports_are_frozen_and_what_it_makes_is_still_collected(setting: str | None) -> None:
    env = {k: v for k, v in os.environ.items() if k != GC_FREEZE_ENV}
    if setting is not None:
        env[GC_FREEZE_ENV] = setting
    run = subprocess.run([sys.executable, "-c", SCRIPT, "torch" if setting is None else "-"], env=env,
                         capture_output=True, text=True, timeout=110)
    assert run.returncode == 0, run.stderr[-2000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["collected"] >= 2  # the cycle made after the freeze
    if setting == "0":
        assert seen["frozen"] == 0
    else:
        assert seen["tracked"] > 50_000  # torch's objects
        assert seen["frozen"] >= seen["tracked"]
