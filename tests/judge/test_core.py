"""The judge's method: verdicts parsed, both orders combined, errors never ties, intervals as scipy computes them."""

from __future__ import annotations

import pytest
from scipy.stats import binomtest

from tunestudio.judge.core import JudgeError, Judgement, Row, Verdict, combine, parse_verdict, run, wilson


@pytest.mark.parametrize(("text", "choice"), [
    ('{"verdict": "1", "reason": "more precise"}', "1"),
    ('Sure. {"verdict": "tie", "reason": "same"} done', "tie"),
    ('{"verdict": "Answer 2", "reason": "x"}', "2"),
    ("2. The second one names the sound.", "2"),
    ("Tie - both say moo", "tie"),
    ("verdict: 1", "1"),
])
def test_a_verdict_is_read_from_json_or_a_leading_word(text: str, choice: str) -> None:
    assert parse_verdict(text).choice == choice


@pytest.mark.parametrize("text", ["", "I cannot decide", '{"verdict": "3"}', "12 apples", "both are fine"])
def test_anything_else_is_an_error_never_a_tie(text: str) -> None:
    verdict = parse_verdict(text)
    assert verdict.choice is None and verdict.error and "unparseable" in verdict.error


def test_a_reason_is_kept() -> None:
    assert parse_verdict('{"verdict": "1", "reason": "it names the sound"}').reason == "it names the sound"


@pytest.mark.parametrize(("first", "second", "outcome"), [
    ("1", "2", "win"),  # the model's answer preferred in both positions
    ("2", "1", "loss"),
    ("tie", "tie", "tie"),
    ("1", "1", "tie"),  # position 1 preferred both times: the position decided, not the answer
    ("2", "2", "tie"),
    ("1", "tie", "tie"),
])
def test_both_orders_cancel_position_bias(first: str, second: str, outcome: str) -> None:
    assert combine(Verdict(first), Verdict(second)) == outcome  # type: ignore[arg-type]
    judgement = Judgement([Row(0, "p", "a", "b", Verdict(first), Verdict(second), outcome)])  # type: ignore[arg-type]
    agree = (first, second) in (("1", "2"), ("2", "1"), ("tie", "tie"))
    assert judgement.summary().disagreements == (0 if agree else 1)


@pytest.mark.parametrize(("k", "n"), [(0, 10), (3, 10), (8, 10), (10, 10), (1, 1), (17, 40), (250, 400)])
def test_the_interval_is_wilsons_as_scipy_computes_it(k: int, n: int) -> None:
    ours = wilson(k, n)
    theirs = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    assert ours.value == pytest.approx(k / n)
    assert ours.low == pytest.approx(theirs.low, abs=1e-9) and ours.high == pytest.approx(theirs.high, abs=1e-9)


def test_no_judged_rows_have_no_rate() -> None:
    assert wilson(0, 0).value is None


def test_a_run_counts_errors_apart_and_judges_each_row_twice() -> None:
    asked: list[str] = []

    def judge(messages: list[dict[str, str]]) -> str:
        text = messages[-1]["content"]
        asked.append(text)
        if "broken" in text:
            raise JudgeError("the judge at http://x did not answer within 1 s")
        if "gibberish" in text:
            return "hmm"
        # prefers an answer saying "moo", else one saying "quack", in whichever position it is
        first = text.split("Answer 1:\n")[1].split("\n\nAnswer 2:")[0]
        liked = "moo" if "moo" in text.split("Which is better?")[0] else "quack"
        return '{"verdict": "1"}' if liked in first else '{"verdict": "2"}'

    def model(messages: list[dict[str, str]]) -> str:
        return "moo" if "cow" in messages[-1]["content"] else "baa"

    def other(messages: list[dict[str, str]]) -> str:
        return "quack"

    prompts = ["cow", "sheep", "cow broken", "cow gibberish", "cow again"]
    judgement = run(prompts, model, other, judge)
    assert [r.outcome for r in judgement.rows] == ["win", "loss", "error", "error", "win"]
    assert len(asked) == 2 * len(prompts)  # both orders, every row
    assert "did not answer" in (judgement.rows[2].error or "")
    assert "unparseable" in (judgement.rows[3].error or "")
    summary = judgement.summary()
    assert (summary.rows, summary.judged, summary.errors) == (5, 3, 2)
    assert (summary.wins, summary.ties, summary.losses) == (2, 0, 1)
    assert summary.win_rate.value == pytest.approx(2 / 3)
    assert summary.win_rate.low is not None and summary.win_rate.low < 2 / 3 < summary.win_rate.high


def test_a_model_that_cannot_answer_makes_an_error_row() -> None:
    def broken(messages: list[dict[str, str]]) -> str:
        raise JudgeError("job-x: is not available")

    judgement = run(["a"], broken, broken, lambda m: "1")
    assert judgement.rows[0].outcome == "error" and "no answer" in (judgement.rows[0].error or "")
