"""The arena's leaderboard from its votes: Bradley–Terry scores with bootstrap intervals, pairwise win rates, the
left answer's advantage, and how often the judge agrees with the people. Standard library only.

A vote is (model A, model B, choice): `a`, `b`, `tie` or `both_bad`. Both-bad counts as a tie in every score (the
people preferred neither; LMArena does the same), and is kept apart in the counts.

Bradley–Terry: P(i beats j) = p_i / (p_i + p_j), fitted by Hunter's minorise–maximise iteration (2004) with a tie
as half a win to each side. A model that never lost would run off to infinity, so every pair that met is given one
more virtual tie (a weak prior towards equal strength, which matters only while votes are few). Scores are on the
Elo scale (400·log10 p), centred so that the mean is 1000. The 95% interval of each score is the 2.5th and 97.5th
percentiles of refits on votes drawn with replacement (`BOOTSTRAP` rounds, a fixed seed: the same votes give the
same board).
"""

from __future__ import annotations

import math
import random
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from tunestudio.judge import wilson

Choice = Literal["a", "b", "tie", "both_bad"]
CHOICES: tuple[Choice, ...] = ("a", "b", "tie", "both_bad")
BOOTSTRAP = 200
SEED = 0
ITERATIONS = 200
TOLERANCE = 1e-9


@dataclass(frozen=True)
class Vote:
    model_a: str
    model_b: str
    choice: Choice
    judge: str | None = None  # the judge's verdict in the same terms (a, b, tie), where it was asked


def _wins(votes: Sequence[Vote]) -> dict[tuple[str, str], float]:
    """(i, j) -> i's wins over j, a tie or both-bad half to each."""
    wins: dict[tuple[str, str], float] = defaultdict(float)
    for v in votes:
        a, b = v.model_a, v.model_b
        if v.choice == "a":
            wins[a, b] += 1
        elif v.choice == "b":
            wins[b, a] += 1
        else:
            wins[a, b] += 0.5
            wins[b, a] += 0.5
    return wins


def bradley_terry(votes: Sequence[Vote], models: Sequence[str]) -> dict[str, float]:
    """Each model's score on the Elo scale (the mean of those with votes 1000); a model without votes scores 1000."""
    wins = _wins(votes)
    met = {frozenset(pair) for pair in wins if pair[0] != pair[1]}
    for pair in met:  # the prior: one virtual tie per pair that met
        i, j = tuple(pair)
        wins[i, j] += 0.5
        wins[j, i] += 0.5
    played = sorted({m for pair in met for m in pair})
    strength = {m: 1.0 for m in played}
    for _ in range(ITERATIONS):
        new = {}
        for i in played:
            won = sum(wins.get((i, j), 0.0) for j in played if j != i)
            denominator = sum((wins.get((i, j), 0.0) + wins.get((j, i), 0.0)) / (strength[i] + strength[j])
                              for j in played if j != i)
            new[i] = won / denominator if denominator > 0 else strength[i]
        scale = math.exp(sum(math.log(s) for s in new.values()) / len(new)) if new else 1.0
        new = {m: s / scale for m, s in new.items()}
        change = max((abs(new[m] - strength[m]) for m in played), default=0.0)
        strength = new
        if change < TOLERANCE:
            break
    return {m: 1000.0 + 400.0 * math.log10(strength[m]) if m in strength else 1000.0 for m in models}


@dataclass
class Standing:
    model: str
    score: float
    low: float | None
    high: float | None
    votes: int
    wins: int
    losses: int
    ties: int
    both_bad: int


def leaderboard(votes: Sequence[Vote], models: Sequence[str] = (), rounds: int = BOOTSTRAP) -> dict[str, Any]:
    """The board: standings (best first), pairwise win rates, position bias and the judge's agreement."""
    everyone = sorted(set(models) | {m for v in votes for m in (v.model_a, v.model_b)})
    scores = bradley_terry(votes, everyone)
    spread: dict[str, list[float]] = defaultdict(list)
    rng = random.Random(SEED)
    for _ in range(rounds if votes else 0):
        drawn = [votes[rng.randrange(len(votes))] for _ in votes]
        played = {m for v in drawn for m in (v.model_a, v.model_b)}
        for model, score in bradley_terry(drawn, sorted(played)).items():  # a model absent from a draw has no score
            spread[model].append(score)
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for v in votes:
        for me, side in ((v.model_a, "a"), (v.model_b, "b")):
            counts[me]["votes"] += 1
            if v.choice in ("tie", "both_bad"):
                counts[me]["ties" if v.choice == "tie" else "both_bad"] += 1
            else:
                counts[me]["wins" if v.choice == side else "losses"] += 1
    standings = []
    for m in everyone:
        c = counts[m]
        low, high = _interval(spread.get(m) if c["votes"] else None)
        standings.append(Standing(m, scores[m], low, high, votes=c["votes"], wins=c["wins"], losses=c["losses"],
                                  ties=c["ties"], both_bad=c["both_bad"]))
    standings.sort(key=lambda s: (-s.score, s.model))
    return {"votes": len(votes), "standings": [asdict(s) for s in standings], "pairs": pairwise(votes),
            "position": position_bias(votes), "judge": judge_agreement(votes), "bootstrap_rounds": rounds,
            "method": "Bradley-Terry (MM), Elo scale, mean 1000; 95% intervals by bootstrap over votes; "
                      "tie and both-bad count half a win to each side"}


def _interval(scores: list[float] | None) -> tuple[float | None, float | None]:
    if not scores:
        return None, None
    ordered = sorted(scores)
    return ordered[int(0.025 * (len(ordered) - 1))], ordered[math.ceil(0.975 * (len(ordered) - 1))]


def pairwise(votes: Sequence[Vote]) -> list[dict[str, Any]]:
    """Per pair of models (in name order): each one's wins, the ties (both-bad among them), and the first one's win
    rate over the pair's votes with its 95% Wilson interval."""
    pairs: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    for v in votes:
        first, second = sorted((v.model_a, v.model_b))
        winner = {"a": v.model_a, "b": v.model_b}.get(v.choice)
        pairs[first, second]["votes"] += 1
        if winner is None:
            pairs[first, second]["ties"] += 1
        else:
            pairs[first, second]["first" if winner == first else "second"] += 1
    out = []
    for (first, second), c in sorted(pairs.items()):
        rate = wilson(c["first"], c["votes"])
        out.append({"model": first, "other": second, "votes": c["votes"], "wins": c["first"],
                    "losses": c["second"], "ties": c["ties"], "win_rate": asdict(rate)})
    return out


def position_bias(votes: Sequence[Vote]) -> dict[str, Any]:
    """How often the left answer (A) won among the votes that chose one; 0.5 is no bias."""
    decisive = [v for v in votes if v.choice in ("a", "b")]
    left = sum(v.choice == "a" for v in decisive)
    return {"decisive": len(decisive), "left_wins": left, "left_rate": asdict(wilson(left, len(decisive)))}


def judge_agreement(votes: Sequence[Vote]) -> dict[str, Any]:
    """Where the judge gave a verdict on a voted pair: how often it chose what the people chose (both-bad as a
    tie), with a Wilson interval."""
    both = [v for v in votes if v.judge in ("a", "b", "tie")]
    agree = sum((v.choice if v.choice != "both_bad" else "tie") == v.judge for v in both)
    return {"compared": len(both), "agree": agree, "rate": asdict(wilson(agree, len(both)))}
