"""A pairwise judge: both models answer each prompt, a judge model compares the answers in both orders.

Standard library only (a base-like module of the judge wing): the answers come from an `Answerer` (the
faces wire it to the inference pool, the same path `/v1/chat/completions` takes) and the verdicts from an
`AskJudge` (judge/endpoint.py: any OpenAI-compatible endpoint, another job on this server included).

Position bias is cancelled by asking twice, the model's answer first and then second. A row is a win when
both orders prefer the model, a loss when both prefer the other, a tie when both say tie or the two orders
disagree (the judge preferred a position, not an answer). A row whose answers or verdicts could not be had
(unreachable judge, time-out, a verdict that does not parse) is an error with its reason, never a tie, and
counts in no rate. Rates carry a 95% Wilson score interval over the judged rows.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Messages = list[dict[str, str]]
Prompt = str | Messages  # one user turn, or a conversation that ends with the user's turn (system, earlier turns)
Answerer = Callable[[Messages], str]  # the model's reply to a conversation; raises JudgeError when it cannot
AskJudge = Callable[[Messages], str]  # the judge's raw reply; raises JudgeError when it cannot
Choice = Literal["1", "2", "tie"]
Outcome = Literal["win", "tie", "loss", "error"]

SYSTEM = "Compare two answers to one question and say which is better: more correct, helpful, to the point. " \
    "Their order means nothing."
TEMPLATE = """Question:
{question}

Answer 1:
{first}

Answer 2:
{second}

Which is better? Reply with JSON: {{"verdict": "1", "2" or "tie", "reason": "one sentence"}}"""
Z95 = 1.959963984540054


class JudgeError(RuntimeError):
    """An answer or a verdict that could not be had; the message says why (it is shown per row)."""


@dataclass
class Verdict:
    choice: Choice | None  # None: no verdict (see error)
    reason: str = ""
    raw: str = ""
    error: str | None = None


@dataclass
class Row:
    index: int
    prompt: str  # the last user turn (what a person reads)
    answer: str | None = None  # the model's (job's)
    other: str | None = None  # the model it is compared against
    first: Verdict | None = None  # the model's answer shown as Answer 1
    second: Verdict | None = None  # the model's answer shown as Answer 2
    outcome: Outcome = "error"
    error: str | None = None
    messages: Messages = field(default_factory=list)  # the conversation both models answered, prompt its last turn


@dataclass
class Rate:
    value: float | None
    low: float | None
    high: float | None


@dataclass
class Summary:
    rows: int  # prompts asked
    judged: int  # rows with a verdict in both orders
    errors: int
    wins: int
    ties: int
    losses: int
    win_rate: Rate
    tie_rate: Rate
    loss_rate: Rate
    score: Rate  # (wins + ties / 2) / judged: above 0.5, the model is preferred
    disagreements: int = 0  # ties because the two orders disagreed (position bias)


@dataclass
class Judgement:
    rows: list[Row] = field(default_factory=list)

    def summary(self) -> Summary:
        judged = [r for r in self.rows if r.outcome != "error"]
        n = len(judged)
        wins = sum(r.outcome == "win" for r in judged)
        ties = sum(r.outcome == "tie" for r in judged)
        losses = sum(r.outcome == "loss" for r in judged)
        disagree = sum(r.first is not None and r.second is not None and _disagree(r.first, r.second) for r in judged)
        return Summary(rows=len(self.rows), judged=n, errors=len(self.rows) - n, wins=wins, ties=ties, losses=losses,
                       win_rate=wilson(wins, n), tie_rate=wilson(ties, n), loss_rate=wilson(losses, n),
                       score=wilson(wins + ties / 2, n), disagreements=disagree)

    def as_dict(self) -> dict[str, Any]:
        return {"summary": asdict(self.summary()), "rows": [asdict(r) for r in self.rows]}


def wilson(successes: float, n: int, z: float = Z95) -> Rate:
    """The rate and its Wilson score interval (well behaved at 0, 1 and small n); all None when n is 0."""
    if n <= 0:
        return Rate(None, None, None)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return Rate(p, max(0.0, centre - half), min(1.0, centre + half))


_JSON = re.compile(r"\{.*?\}", re.S)
_WORD = re.compile(r"^\W*(?:verdict\W*)?(answer\s*)?(1|2|tie)\b", re.I)


def parse_verdict(text: str) -> Verdict:
    """The judge's reply as a verdict: a JSON object with `verdict` (1, 2 or tie) and `reason`, or a reply that
    starts with 1, 2 or tie. Anything else is an error naming what came back (never a tie)."""
    raw = text.strip()
    for match in _JSON.finditer(raw):
        try:
            data = json.loads(match.group(0))
        except ValueError:
            continue
        if isinstance(data, dict) and "verdict" in data:
            choice = str(data["verdict"]).strip().lower().removeprefix("answer").strip()
            if choice in ("1", "2", "tie"):
                return Verdict(choice, str(data.get("reason", ""))[:2000], raw[:2000])  # type: ignore[arg-type]
            break
    word = _WORD.match(raw)
    if word:
        return Verdict(word.group(2).lower(), raw[word.end():].strip(" .:-\n")[:2000], raw[:2000])  # type: ignore[arg-type]
    shown = raw[:80] + ("…" if len(raw) > 80 else "")
    return Verdict(None, raw=raw[:2000], error=f"unparseable verdict: {shown!r} (wanted 1, 2 or tie)")


def _per_order(first: Verdict, second: Verdict) -> tuple[str, str]:
    """Each order's outcome for the model: its answer was Answer 1 in the first order, Answer 2 in the second."""
    return ({"1": "win", "2": "loss", "tie": "tie"}[first.choice or "tie"],
            {"2": "win", "1": "loss", "tie": "tie"}[second.choice or "tie"])


def _disagree(first: Verdict, second: Verdict) -> bool:
    mine_first, mine_second = _per_order(first, second)
    return first.choice is not None and second.choice is not None and mine_first != mine_second


def combine(first: Verdict, second: Verdict) -> Outcome:
    """The row's outcome from the verdict with the model's answer first and the one with it second."""
    if first.choice is None or second.choice is None:
        return "error"
    mine_first, mine_second = _per_order(first, second)
    return mine_first if mine_first == mine_second else "tie"  # type: ignore[return-value]  # orders disagree: a tie


def conversation(prompt: Prompt) -> Messages:
    """The turns both models answer: a text as one user turn; a conversation as it is."""
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]


def question_text(messages: Messages) -> str:
    """What the judge reads as the question: one user turn as it is; a longer conversation turn by turn."""
    if len(messages) == 1:
        return messages[0]["content"]
    return "\n\n".join(f"{m['role'].capitalize()}: {m['content']}" for m in messages)


def _shown(messages: Messages) -> str:
    users = [m["content"] for m in messages if m.get("role") == "user"]
    return users[-1] if users else messages[-1]["content"]


def judge_messages(question: str, first: str, second: str) -> Messages:
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": TEMPLATE.format(question=question, first=first, second=second)}]


def _ask(ask: AskJudge, question: str, first: str, second: str) -> Verdict:
    try:
        return parse_verdict(ask(judge_messages(question, first, second)))
    except JudgeError as exc:
        return Verdict(None, error=str(exc))


def judge_row(index: int, prompt: Prompt, answer: Answerer, other: Answerer, ask: AskJudge) -> Row:
    """One prompt (a user turn, or a conversation ending with one): both answers to the whole of it, then the judge
    in both orders, shown the whole of it too."""
    messages = conversation(prompt)
    row = Row(index, _shown(messages), messages=messages)
    try:
        row.answer = answer(messages)
        row.other = other(messages)
    except JudgeError as exc:
        row.error = f"no answer: {exc}"
        return row
    question = question_text(messages)
    row.first = _ask(ask, question, row.answer, row.other)
    row.second = _ask(ask, question, row.other, row.answer)
    row.outcome = combine(row.first, row.second)
    if row.outcome == "error":
        row.error = "; ".join(f"{name}: {v.error}" for name, v in (("model first", row.first),
                                                                     ("model second", row.second)) if v.error)
    return row


def run(prompts: Sequence[Prompt], answer: Answerer, other: Answerer, ask: AskJudge,
        on_row: Callable[[Row], None] | None = None, stopped: Callable[[], bool] | None = None) -> Judgement:
    """Judge every prompt in order (on_row after each); stops between rows when `stopped()` says so, and drops the
    row under way when it says so during it (its calls were cut: an error that is no verdict on the model)."""
    judgement = Judgement()
    for index, prompt in enumerate(prompts):
        if stopped is not None and stopped():
            break
        row = judge_row(index, prompt, answer, other, ask)
        if stopped is not None and stopped():
            break
        judgement.rows.append(row)
        if on_row is not None:
            on_row(row)
    return judgement
