"""Jobs on a real Ray cluster (Ray Train, 2 workers), all of it inside a private network namespace.

Ray listens on every interface and probes a public resolver by default, so the
cluster and every process that talks to it run under `unshare -n` with only the
loopback interface up (tests/helpers/ray_cluster.py). Skipped, with the reason,
where ray is not installed (`pip install -e '.[ray]'`) or unshare is not allowed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tunestudio.config import JobConfig
from tunestudio.jobs.executor import executor_for
from tunestudio.jobs.ray_cluster import RayExecutor
from tunestudio.settings import Settings

from ..helpers import fake_workers
from ..helpers.netns import namespace_problem

REPO = Path(__file__).resolve().parents[2]


def test_the_ray_setting_chooses_the_ray_executor(tmp_path: Path) -> None:
    config = JobConfig.model_validate({"model_name": "org/fake", "local_datasets": ["x.jsonl"], "num_processes": 2})
    settings = Settings(executor="ray", ray_address="127.0.0.1:6390")
    chosen = executor_for(config, fake_workers.ignores_stop, kind=settings.executor, ray_address=settings.ray_address)
    assert isinstance(chosen, RayExecutor) and chosen.address == "127.0.0.1:6390" and chosen.num_processes == 2


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_jobs_on_a_ray_cluster_complete_and_cancel_leaving_no_actor(tiny_model: Path, tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="ray is an optional extra: pip install -e '.[ray]'")
    problem = namespace_problem()
    if problem:
        pytest.skip(problem)
    script = f"ip link set lo up && exec {sys.executable} -m tests.helpers.ray_cluster {tiny_model} {tmp_path}"
    proc = subprocess.run(["unshare", "-n", "bash", "-c", script], capture_output=True, text=True, timeout=880,
                          cwd=REPO)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (proc.stdout[-3000:], proc.stderr[-3000:])
    seen = json.loads(lines[0][len("RESULT "):])
    done = seen["done"]
    assert done["kind"] == "completed", (done, (tmp_path / "done.log").read_text()[-3000:])
    assert done["steps"] == [1, 2, 3, 4, 5] and done["global_batch"] == [8] and done["adapter"]
    assert seen["live"] >= 3  # the driver and two train workers were there while it ran
    assert seen["cancel"]["kind"] == "cancelled", seen["cancel"]
    assert seen["left"] == []  # no driver, train worker or queue actor of either job survives
