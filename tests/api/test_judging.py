"""The judge's answers from the inference pool (api/judging.py) with a scripted pool: an answer the worker never
finishes is cancelled after the idle bound and its row is an error naming it, never a tie; an answer that keeps
streaming is whole; a worker's error and a closing pool are no answers."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tests.helpers.wait import wait_until
from tunestudio.api import judging
from tunestudio.api.judging import pool_answerer
from tunestudio.inference_protocol import Delta, Done, Error, Reply, Started
from tunestudio.judge.core import JudgeError, run

IDLE_S = 1.0


class Scripted:
    """A pool whose worker answers each model with a script of (pause, reply) steps, then falls silent."""

    def __init__(self, scripts: dict[str, list[tuple[float, Reply]]]) -> None:
        self.scripts = scripts
        self.cancelled: list[str] = []
        self.threads: list[threading.Thread] = []

    def generate(self, spec: str, messages: Any, params: Any, deliver: Any = None) -> Any:
        def play() -> None:
            for pause, reply in self.scripts[spec]:
                time.sleep(pause)
                deliver(reply)

        thread = threading.Thread(target=play, daemon=True)
        thread.start()
        self.threads.append(thread)
        pool = self

        class Generation:
            def cancel(self) -> None:
                pool.cancelled.append(spec)

        return Generation()


@pytest.fixture(autouse=True)
def _model_ids_as_specs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(judging, "resolve", lambda jobs, model_id: model_id)


def answers(pool: Scripted, model: str, timeout: float = IDLE_S) -> Any:
    return pool_answerer(pool, None, model, idle_timeout=timeout)  # type: ignore[arg-type]


def test_a_hung_answer_is_cancelled_and_its_row_is_an_error_not_a_tie() -> None:
    pool = Scripted({
        "job": [(0, Started(1, 3)), (0, Delta(1, "mo"))],  # started, a piece of text, then nothing more
        "job:base": [(0, Started(2, 3)), (0, Delta(2, "baa")), (0, Done(2, "stop"))],
    })
    judgement = run(["cow"], answers(pool, "job"), answers(pool, "job:base"), lambda messages: "tie")
    [row] = judgement.rows
    assert row.outcome == "error" and row.first is None and row.answer is None
    assert row.error is not None and "job: the inference worker said nothing for 1 s" in row.error
    assert pool.cancelled == ["job"]
    summary = judgement.summary()
    assert (summary.errors, summary.ties, summary.judged) == (1, 0, 0)


def test_an_answer_that_keeps_streaming_is_not_cut() -> None:
    # 0.1 s between pieces, 2.5 s in all: longer than the bound (2 s), and a piece held back by a loaded machine
    # still comes well within it
    steps: list[tuple[float, Reply]] = [(0.1, Delta(1, "m")) for _ in range(25)]
    pool = Scripted({"job": [(0, Started(1, 3)), *steps, (0, Done(1, "stop"))]})
    assert answers(pool, "job", timeout=2.0)([{"role": "user", "content": "cow"}]) == "m" * 25
    assert pool.cancelled == []


@pytest.mark.parametrize(("last", "says"), [
    (Error(1, "the model could not be loaded", 503), "job: the model could not be loaded"),
    (Done(1, "cancelled"), "job: the answer was cancelled"),
])
def test_a_failed_or_cancelled_answer_is_no_answer(last: Reply, says: str) -> None:
    pool = Scripted({"job": [(0, Started(1, 3)), (0, Delta(1, "mo")), (0, last)]})
    with pytest.raises(JudgeError) as caught:
        answers(pool, "job", timeout=30)([{"role": "user", "content": "cow"}])
    assert says in str(caught.value)


def test_a_cancel_ends_an_answer_under_way_and_cancels_it() -> None:
    pool = Scripted({"job": [(0, Started(1, 3)), (0, Delta(1, "mo"))]})  # then silent: only the cancel ends it
    cancel = threading.Event()
    answer = pool_answerer(pool, None, "job", idle_timeout=600, cancel=cancel)  # type: ignore[arg-type]
    caught: list[JudgeError] = []

    def ask() -> None:
        try:
            answer([{"role": "user", "content": "cow"}])
        except JudgeError as exc:
            caught.append(exc)

    thread = threading.Thread(target=ask)
    thread.start()
    wait_until(lambda: pool.threads and not pool.threads[0].is_alive(), 10, "the worker's script to play")
    cancel.set()
    thread.join(10)
    assert not thread.is_alive() and "job: the answer was cancelled (the judgement was)" in str(caught[0])
    assert pool.cancelled == ["job"]
