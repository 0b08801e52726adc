"""`tunestudio chat JOB --image FILE` as a user runs it: a real process and a real inference worker, image jobs
recorded cheaply (tests/helpers/vision.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tunestudio.jobs.manager import JobManager
from tunestudio.settings import Settings

from .helpers.vision import PICTURE, QUESTION, copies_its_model, record_jobs

CLI = [sys.executable, "-m", "tunestudio.cli"]
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> tuple[Path, dict[str, str]]:
    folder = tmp_path_factory.mktemp("cli-images")
    with JobManager(Settings(home=folder / "home", prewarm=False), worker_target=copies_its_model) as manager:
        manager.start()
        return folder / "home", record_jobs(manager, folder, tiny_model)


def chat(home: Path, *args: str, typed: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TUNESTUDIO_HOME": str(home), "COLUMNS": "200"}
    return subprocess.run([*CLI, "chat", *args], input=typed, capture_output=True, text=True, env=env, timeout=180)


def test_the_picture_goes_with_the_first_message_and_stays_in_the_conversation(
        recorded: tuple[Path, dict[str, str]]) -> None:
    home, jobs = recorded
    proc = chat(home, jobs["smolvlm"], "--image", str(PICTURE), "--max-tokens", "4",
                typed=f"{QUESTION}\n/prompt\nAnd its shape?\n/prompt\n/exit\n")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert len(re.findall(r"\(\d+ tokens(, cut at max_tokens)?\)\n", proc.stdout)) == 2  # both questions answered
    prompts = proc.stdout.split("the prompt the model read")[1:]
    # the picture's tokens before the first question, once, in both prompts
    assert [p.count("<global-img>") for p in prompts] == [1, 1]
    assert f"<image><fake_token_around_image>{QUESTION}" in prompts[0] and "And its shape?" in prompts[1]


def test_a_text_model_an_unreadable_file_and_a_non_picture_are_refused(
        recorded: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    home, jobs = recorded
    text = chat(home, jobs["text"], "--image", str(PICTURE), typed="/exit\n")
    assert text.returncode == 2 and "reads no images" in text.stderr
    missing = chat(home, jobs["smolvlm"], "--image", str(tmp_path / "nope.png"), typed="/exit\n")
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    (tmp_path / "notes.png").write_text("not a picture")
    notes = chat(home, jobs["qwen2_vl"], "--image", str(tmp_path / "notes.png"), typed=f"{QUESTION}\n/exit\n")
    assert notes.returncode == 0 and "the image cannot be read" in notes.stderr  # the worker's word, the chat goes on
