"""The prewarmed forkserver never outlives the process that started it, however that process ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tunestudio.worker.child import pid_alive

from ..helpers.wait import wait_until

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import json, sys, time
    from multiprocessing import forkserver
    from tunestudio.jobs.manager import JobManager
    from tunestudio.settings import Settings
    from tests.helpers import fake_workers
    from tests.helpers.jobs import job_config

    home, how = sys.argv[1], sys.argv[2]
    manager = JobManager(Settings(home=home, prewarm=True), worker_target=fake_workers.ignores_stop).start()
    deadline = time.monotonic() + 60
    while forkserver._forkserver._forkserver_pid is None and time.monotonic() < deadline:
        time.sleep(0.005)
    out = {"forkserver": forkserver._forkserver._forkserver_pid}
    if how == "job":  # a worker forked from it, training
        job = manager.submit(job_config("org/fake", home + "/out"))
        while not manager.get(job.id).worker_pid and time.monotonic() < deadline:
            time.sleep(0.02)
        out["worker"] = manager.get(job.id).worker_pid
    print(json.dumps(out), flush=True)
    if how == "close":
        sys.stdin.readline()  # the test has seen the forkserver alive: closing before that raced its check
        manager.close()  # a server stopped right after start-up: the forkserver is still importing
        sys.exit(0)
    time.sleep(600)  # killed by the test
""")


@pytest.mark.parametrize("how", ["close", "kill", "job"])
def test_the_forkserver_is_gone_within_2_s_of_its_parent(tmp_path: Path, how: str) -> None:
    env = {**os.environ, "TUNESTUDIO_HOME": str(tmp_path / "home")}
    with subprocess.Popen([sys.executable, "-c", SCRIPT, str(tmp_path / "home"), how], cwd=REPO, env=env,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            pids = json.loads(proc.stdout.readline())
            assert pids["forkserver"] and pid_alive(pids["forkserver"])
            if how == "close":
                assert proc.stdin is not None
                proc.stdin.write("close\n")
                proc.stdin.flush()
                proc.wait(60)
            else:
                proc.send_signal(signal.SIGKILL)  # killed mid-preload ("kill"), or with a worker running ("job")
                proc.wait(10)
        finally:
            proc.kill()
    for name, pid in pids.items():
        assert pid
        wait_until(lambda pid=pid: not pid_alive(pid), 2.0, f"the {name} (pid {pid}) to be gone")


def test_on_a_machine_with_a_gpu_workers_are_spawned_and_no_forkserver_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The forkserver's imports would start CUDA there (bitsandbytes reads the devices), and no fork could use it.
    from tunestudio.jobs import prewarm

    device = tmp_path / "nvidia0"
    monkeypatch.setattr(prewarm, "GPU_DEVICE_FILES", (str(tmp_path / "kfd"), str(device)))
    assert prewarm.context(True).get_start_method() == "forkserver"  # no device file: prewarm as asked
    device.touch()
    assert prewarm.gpu_present() and not prewarm.forks(True)
    assert prewarm.context(True).get_start_method() == "spawn"
    assert prewarm.context(False).get_start_method() == "spawn"
    started: list[bool] = []
    monkeypatch.setattr(prewarm.forkserver, "ensure_running", lambda: started.append(True))
    prewarm.warm_up().join(5)
    assert started == []
