"""`tunestudio bench` as a user runs it: a real process serving /v1/completions for its run, a real bench worker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tunestudio.jobs.models import Job

from .helpers.chat import ChatHome

CLI = [sys.executable, "-m", "tunestudio.cli"]
pytestmark = pytest.mark.timeout(900)  # the session's chat job trains first


def bench(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TUNESTUDIO_HOME": str(home), "COLUMNS": "200"}
    return subprocess.run([*CLI, "bench", *args], capture_output=True, text=True, env=env, timeout=600)


def test_an_unknown_task_fails_naming_it_and_a_bad_option_names_the_field(chat_home: ChatHome) -> None:
    job: Job = chat_home.job
    unknown = bench(chat_home.home, job.id, "--tasks", "no_such_task_xyz")
    assert unknown.returncode == 1, unknown.stdout + unknown.stderr
    assert "no task or group named 'no_such_task_xyz'" in unknown.stdout + unknown.stderr
    nothing = bench(chat_home.home, job.id)
    assert nothing.returncode == 2 and "tasks" in nothing.stderr
    missing = bench(chat_home.home, "no-such-job", "--tasks", "arc_easy")
    assert missing.returncode == 2 and "no-such-job" in missing.stderr
