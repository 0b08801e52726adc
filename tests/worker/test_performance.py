"""The training process's allocator keeps a step's freed memory for the next step (worker/train/performance.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# A step's activations as glibc sees them: after one block above its first mmap threshold is freed (its dynamic
# thresholds move), three blocks are allocated, used and freed each step; page faults counted over 20 steps.
SCRIPT = textwrap.dedent("""
    import json, resource, sys
    import numpy as np
    from tunestudio.worker.train.performance import configure_allocator

    chosen = configure_allocator() if sys.argv[1] == "configure" else None
    np.ones(8 << 20, dtype=np.uint8)

    def step():
        blocks = [np.ones(6 << 20, dtype=np.uint8) for _ in range(3)]
        del blocks

    step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        step()
    print(json.dumps({"set": chosen, "faults": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20}))
""")


def _run(how: str, **env: str) -> dict[str, float]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, how], cwd=REPO, env={**clean, **env}, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_step_memory_is_kept_unless_the_user_chose_the_thresholds() -> None:
    default = _run("as is")
    assert default["faults"] > 1000  # 18 MiB handed back and faulted in again every step (4 KiB pages)
    configured = _run("configure")
    assert configured["set"] is True and configured["faults"] < 50
    users_own = _run("configure", MALLOC_TRIM_THRESHOLD_="999999")
    assert users_own["set"] is False and users_own["faults"] > 1000  # their setting stands
