"""`tunestudio judge` as a user runs it: a real process whose own inference worker answers with the session's chat
job and its base model; the judge a scripted OpenAI-compatible endpoint on loopback that records what it is asked
and prefers the first answer when the question mentions a cow, else says tie."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from tunestudio.cli.judge import cancel_on_interrupt
from tunestudio.jobs.models import Job

from .helpers.chat import ChatHome
from .helpers.scripted_v1 import SEEN, Scripted
from .helpers.server import loopback_v1
from .helpers.wait import wait_until

CLI = [sys.executable, "-m", "tunestudio.cli"]
pytestmark = pytest.mark.timeout(900)  # the session's chat job trains first
ASKED: list[list[dict[str, str]]] = []


class Judge(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        messages = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["messages"]
        ASKED.append(messages)
        verdict = json.dumps({"verdict": "1" if "cow" in messages[-1]["content"] else "tie", "reason": "scripted"})
        raw = json.dumps({"choices": [{"message": {"role": "assistant", "content": verdict}}]})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw.encode())


@pytest.fixture(scope="module")
def judge_url() -> Iterator[str]:
    with loopback_v1(Judge) as base:
        yield base


def judge(home: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TUNESTUDIO_HOME": str(home), "COLUMNS": "200", "TUNESTUDIO_JUDGE_URL": url,
           "TUNESTUDIO_JUDGE_MODEL": "scripted"}
    return subprocess.run([*CLI, "judge", *args], capture_output=True, text=True, env=env, timeout=600)


def test_a_job_is_judged_on_its_held_out_rows(chat_home: ChatHome, judge_url: str) -> None:
    job: Job = chat_home.job
    ASKED.clear()
    run = judge(chat_home.home, judge_url, job.id, "--limit", "3", "--max-tokens", "4", "--json")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    judged = json.loads(run.stdout.strip().splitlines()[-1])
    assert judged["job_id"] == job.id and judged["against"] == f"{job.id}:base"
    assert judged["judge"] == {"url": judge_url, "model": "scripted"}
    held = json.loads(Path(job.result["evaluation"]["rows_file"]).read_text())["rows"][:3]
    assert [r["prompt"] for r in judged["rows"]] == [r["prompt"] for r in held]
    for row in judged["rows"]:
        assert isinstance(row["answer"], str) and isinstance(row["other"], str)  # both models answered
        assert row["first"]["choice"] == row["second"]["choice"] == "tie" and row["outcome"] == "tie"
    assert judged["summary"]["judged"] == 3 and judged["summary"]["tie_rate"]["value"] == 1.0
    assert len(ASKED) == 6  # both orders, every row


def test_a_prompt_file_is_judged_row_by_row_and_summed_up(chat_home: ChatHome, judge_url: str,
                                                          tmp_path: Path) -> None:
    job: Job = chat_home.job
    prompts = tmp_path / "prompts.jsonl"
    conversation = [{"role": "system", "content": "Answer in one word."},
                    {"role": "user", "content": "What colour is it?\n\nbanana"},
                    {"role": "assistant", "content": "yellow"},
                    {"role": "user", "content": "What sound does this animal make?\n\ncow"}]
    prompts.write_text(json.dumps({"messages": conversation}) + "\n" + json.dumps("Write the opposite: big") + "\n")
    ASKED.clear()
    run = judge(chat_home.home, judge_url, job.id, "--prompts", str(prompts), "--max-tokens", "4")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = run.stdout
    assert f"judging job {job.id} against {job.id}:base on 2 prompts" in out
    # the cow row: Answer 1 preferred in both orders (a position, not an answer): a tie by disagreement
    assert "tie     1. What sound does this animal make?  cow" in out and "tie     2. Write the opposite: big" in out
    words = " ".join(out.split())  # the table's title wraps at its width
    assert "2 of 2 rows judged in both orders" in words and "tie │ 2 │ 100.0% [34.2%, 100.0%]" in words
    assert "System: Answer in one word." in ASKED[0][-1]["content"]  # the judge read the whole conversation


def test_ctrl_c_sets_the_cancel_and_a_second_one_quits() -> None:
    previous = signal.getsignal(signal.SIGINT)
    with cancel_on_interrupt() as cancel:
        signal.raise_signal(signal.SIGINT)
        assert cancel.is_set()
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is previous


def test_ctrl_c_cancels_a_judgement_whose_judge_trickles(chat_home: ChatHome) -> None:
    """The judge sends a byte every 0.2 s with a 600 s deadline: Ctrl-C cuts the call under way and the command
    ends with the rows judged before (none) and exit code 130."""
    job: Job = chat_home.job
    with loopback_v1(Scripted) as url:
        before = len(SEEN["trickle"])
        env = {**os.environ, "TUNESTUDIO_HOME": str(chat_home.home), "COLUMNS": "200", "TUNESTUDIO_JUDGE_URL": url,
               "TUNESTUDIO_JUDGE_MODEL": "trickle", "TUNESTUDIO_JUDGE_DEADLINE_S": "600"}
        proc = subprocess.Popen([*CLI, "judge", job.id, "--limit", "2", "--max-tokens", "4"], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            wait_until(lambda: len(SEEN["trickle"]) > before or proc.poll() is not None, 300,
                       "the judge's first call")
            proc.send_signal(signal.SIGINT)
            out, errors = proc.communicate(timeout=60)
        finally:
            proc.kill()
    assert proc.returncode == 130, out[-3000:] + errors[-3000:]
    assert "cancelled after 0 of 2 rows" in errors and "0 of 0 rows judged" in " ".join(out.split())
