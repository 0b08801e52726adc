"""The process helpers both sides share."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tunestudio.process import THREADS_ENV, describe_exit, kill_group, pid_alive, start_context, torch_threads

from .helpers.wait import wait_until


def test_describe_exit() -> None:
    assert describe_exit(-9) == "worker killed by signal 9 (SIGKILL) — possibly out of memory"
    assert describe_exit(-9, asked=True) == "worker killed by signal 9 (SIGKILL)"  # our own escalation's
    assert describe_exit(-15) == "worker killed by signal 15 (SIGTERM)"
    assert describe_exit(1) == "worker exited with code 1"
    assert describe_exit(None) == "worker did not exit"


def test_pid_alive_knows_the_living_the_dead_and_the_zombies() -> None:
    assert pid_alive(os.getpid())
    assert not pid_alive(None) and not pid_alive(0)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert pid_alive(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(proc.pid), 5, "the killed child to read as gone (a zombie is gone)")
    proc.wait(5)
    assert not pid_alive(proc.pid)


def test_kill_group_reaches_the_whole_group_and_tolerates_the_gone() -> None:
    leader = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time; "
         "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); print(c.pid, flush=True); "
         "time.sleep(60)"],
        start_new_session=True, stdout=subprocess.PIPE, text=True)
    assert leader.stdout is not None
    grandchild = int(leader.stdout.readline())
    kill_group(leader.pid, signal.SIGKILL)
    leader.wait(5)
    leader.stdout.close()
    wait_until(lambda: not pid_alive(grandchild), 5, "the grandchild to die with its group")
    kill_group(leader.pid, signal.SIGKILL)  # gone already: no error
    kill_group(None, signal.SIGKILL)


def test_start_context() -> None:
    assert start_context(False).get_start_method() == "spawn"
    assert start_context(True, ["json"]).get_start_method() == "forkserver"


def test_torch_threads_are_the_cores_capped_by_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(THREADS_ENV, raising=False)
    assert torch_threads(8) == 8 and torch_threads(1) == 1
    monkeypatch.setenv(THREADS_ENV, "3")
    assert torch_threads(8) == 3 and torch_threads(2) == 2
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv(THREADS_ENV, bad)
        with pytest.raises(ValueError, match=THREADS_ENV):
            torch_threads(8)
