"""`tunestudio chat` as a user runs it: a real process, a real inference worker, a trained job."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tunestudio.jobs.models import Job

from .helpers.chat import ChatHome, add_saved_step

CLI = [sys.executable, "-m", "tunestudio.cli"]
# The first chat test of the session waits for its training job (minutes on a busy 2-core machine): a generous
# hard timeout.
pytestmark = pytest.mark.timeout(900)
# "What sound does this animal make?\n\ncow", typed with backslash continuations, then /exit.
TYPED = "What sound does this animal make?\\\n\\\ncow\n/exit\n"


@pytest.fixture(scope="module")
def home(chat_home: ChatHome) -> Path:
    return chat_home.home


@pytest.fixture(scope="module")
def job(chat_home: ChatHome) -> Job:
    return chat_home.job


def chat(home: Path, *args: str, typed: str = TYPED) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TUNESTUDIO_HOME": str(home), "COLUMNS": "200"}
    return subprocess.run([*CLI, "chat", *args], input=typed, capture_output=True, text=True, env=env, timeout=180)


def test_compare_prints_both_answers_to_a_multi_line_prompt(job: Job, home: Path) -> None:
    proc = chat(home, job.id, "--compare")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    sample = job.result["samples"][0]  # what the training worker generated for the same prompt
    # Each reply streams after its label and ends with its token count; a reply may span lines.
    answers = dict(re.findall(r"^(base model|fine-tuned) › (.*?)  \(\d+ tokens", proc.stdout, re.M | re.S))
    assert answers["base model"].strip() == sample["before"]
    assert answers["fine-tuned"].strip() == sample["after"]


def test_base_alone_and_the_errors_a_user_can_make(job: Job, home: Path) -> None:
    proc = chat(home, job.id, "--base")
    assert proc.returncode == 0 and "base model › " in proc.stdout and "fine-tuned" not in proc.stdout
    missing = chat(home, "no-such-job")
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    both = chat(home, job.id, "--base", "--compare")
    assert both.returncode == 2 and "exclude" in both.stderr


def test_a_saved_step_with_a_system_prompt_and_the_prompt_it_read(job: Job, home: Path) -> None:
    add_saved_step(job, 20)
    system = "You answer like a farmer."
    proc = chat(home, job.id, "--step", "20", "--system", system, "--max-tokens", "8",
                typed="/prompt\n" + TYPED.replace("/exit\n", "/prompt\n/exit\n"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"job {job.id} at step 20" in proc.stdout and "no message yet" in proc.stdout
    assert f"<|system|>{system}<|end|><|user|>What sound does this animal make?\n\ncow<|end|><|assistant|>\n" \
        in proc.stdout
    missing = chat(home, job.id, "--step", "7")
    assert missing.returncode == 2 and "checkpoint-7" in missing.stderr
    both = chat(home, job.id, "--base", "--step", "20")
    assert both.returncode == 2 and "exclude" in both.stderr
