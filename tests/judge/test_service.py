"""Judgements in the background (judge/service.py) with a scripted judge on loopback and answers from a stand-in:
a judge that trickles its reply is cut at the deadline the environment sets, and the judgement ends, its rows
errors naming the deadline; a cancel cuts the call under way and ends it as cancelled, keeping the rows before."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.scripted_v1 import SEEN, Scripted
from tests.helpers.server import loopback_v1
from tests.helpers.wait import wait_until
from tunestudio.judge import Endpoint, JudgementOver, Judgements
from tunestudio.judge.core import Answerer, AskJudge, Messages


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with loopback_v1(Scripted) as base:
        yield base


def answers(model_id: str, max_tokens: int, cancel: threading.Event) -> Answerer:
    def answer(messages: Messages) -> str:
        return f"{model_id} says moo"

    return answer


def judge(url: str, model: str, monkeypatch: pytest.MonkeyPatch, deadline: str) -> Endpoint:
    monkeypatch.setenv("TUNESTUDIO_JUDGE_URL", url)
    monkeypatch.setenv("TUNESTUDIO_JUDGE_MODEL", model)
    monkeypatch.setenv("TUNESTUDIO_JUDGE_DEADLINE_S", deadline)
    return Endpoint.from_env()


def test_a_trickling_judge_is_cut_at_its_deadline_and_the_judgement_ends(
        url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    judgements = Judgements(tmp_path, answers)
    endpoint = judge(url, "trickle", monkeypatch, "0.5")
    started = judgements.start("job", "job", "job:base", ["cow?"], endpoint.cancellable, endpoint.describe(), "test")
    # before the deadline covered the whole call, a byte every 0.2 s kept it running for ever
    done = wait_until(lambda: r if (r := judgements.get(started["id"]))["status"] != "running" else None, 30,
                      "the judgement's end")
    judgements.close()
    assert done["status"] == "failed" and "deadline of 0.5 s" in done["message"]
    [row] = done["rows"]
    assert row["outcome"] == "error"
    for verdict in (row["first"], row["second"]):
        assert verdict["error"] == f"the judge at {url} did not answer within its deadline of 0.5 s"


def test_a_cancel_cuts_the_call_under_way_and_keeps_the_rows_before(
        url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    judgements = Judgements(tmp_path, answers)
    calls: list[Messages] = []  # the judge's calls: the first row's two, then the second row's
    endpoint = judge(url, "trickle", monkeypatch, "60")

    def judge_for(cancel: threading.Event) -> AskJudge:
        cut = endpoint.cancellable(cancel)
        fine = Endpoint(url, "fine", cancel=cancel)

        def ask(messages: Messages) -> str:  # the first row is judged; the second's first call trickles
            calls.append(messages)
            return (fine if len(calls) <= 2 else cut)(messages)

        return ask

    before = len(SEEN["trickle"])
    started = judgements.start("job", "job", "job:base", ["cow?", "pig?", "hen?"], judge_for, endpoint.describe(),
                               "test")
    wait_until(lambda: len(SEEN["trickle"]) > before, 30, "the second row's call to reach the judge")
    record = judgements.cancel(started["id"])
    assert record["status"] == "cancelled" and "the 1 rows judged before it are kept" in record["message"]
    assert [r["prompt"] for r in record["rows"]] == ["cow?"]  # the row cut under way is no verdict: dropped
    assert len(SEEN["trickle"]) == before + 1  # the judge heard nothing more after the cancel
    with pytest.raises(JudgementOver, match="is cancelled"):
        judgements.cancel(started["id"])
    judgements.close()
