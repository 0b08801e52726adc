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

# A fresh interpreter, as a spawned training worker is (a machine with a GPU, or prewarm off): freeze_imports
# imports what a training job uses (PRELOAD) before it freezes.
SCRIPT = """
import gc, json, sys
from tunestudio.worker.child import freeze_imports
freeze_imports(trains=sys.argv[1] == "trains")
frozen = gc.get_freeze_count()
class Node:
    pass
a, b = Node(), Node()
a.other, b.other = b, a  # a cycle made after the freeze: only the collector frees it
del a, b
print(json.dumps({"frozen": frozen, "collected": gc.collect(), "loaded": sorted(
    name for name in ("torch", "transformers", "peft", "trl") if name in sys.modules)}))
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("setting", [None, "0"])
def test_a_training_worker_s_imports_are_frozen_and_what_it_makes_is_still_collected(setting: str | None) -> None:
    env = {k: v for k, v in os.environ.items() if k != GC_FREEZE_ENV}
    if setting is not None:
        env[GC_FREEZE_ENV] = setting
    run = subprocess.run([sys.executable, "-c", SCRIPT, "trains" if setting is None else "-"], env=env,
                         capture_output=True, text=True, timeout=110)
    assert run.returncode == 0, run.stderr[-2000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["collected"] >= 2  # the cycle made after the freeze
    if setting == "0":
        assert seen["frozen"] == 0
    else:
        assert seen["loaded"] == ["peft", "torch", "transformers", "trl"]
        assert seen["frozen"] > 300_000  # the forkserver's preload holds about 560,000
