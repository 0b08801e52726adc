"""The leaderboard's arithmetic against what it must be: Bradley–Terry's fitted probabilities reproduce the observed
win rates, scores order the models as their votes do, intervals hold the score, Wilson rates are the judge's."""

from __future__ import annotations

import math

from tunestudio.arena import Vote, bradley_terry, leaderboard


def _p(scores: dict[str, float], i: str, j: str) -> float:
    return 1 / (1 + 10 ** ((scores[j] - scores[i]) / 400))


def test_bradley_terry_fits_the_observed_rate_of_a_pair() -> None:
    # 30 votes: x wins 20, y wins 10. With the prior's one virtual tie the maximum-likelihood P(x beats y) is
    # 20.5 / 31 exactly (the MM fixed point for two players).
    votes = [Vote("x", "y", "a")] * 20 + [Vote("y", "x", "a")] * 10
    scores = bradley_terry(votes, ["x", "y"])
    assert math.isclose(_p(scores, "x", "y"), 20.5 / 31, rel_tol=1e-6)
    assert math.isclose((scores["x"] + scores["y"]) / 2, 1000, abs_tol=1e-6)


def test_a_chain_of_strengths_is_ordered_and_a_pair_never_won_stays_finite() -> None:
    votes = ([Vote("strong", "mid", "a")] * 8 + [Vote("mid", "strong", "a")] * 2
             + [Vote("mid", "weak", "a")] * 8 + [Vote("weak", "mid", "a")] * 2
             + [Vote("strong", "weak", "a")] * 5)  # weak never beat strong
    board = leaderboard(votes, ["strong", "mid", "weak", "idle"], rounds=50)
    order = [s["model"] for s in board["standings"]]
    assert order[0] == "strong" and order[-1] == "weak"
    standings = {s["model"]: s for s in board["standings"]}
    assert all(math.isfinite(s["score"]) for s in board["standings"])
    assert standings["idle"]["votes"] == 0 and standings["idle"]["score"] == 1000 and standings["idle"]["low"] is None
    for s in board["standings"]:
        if s["votes"]:
            assert s["low"] <= s["score"] <= s["high"]
    assert standings["strong"]["wins"] == 13 and standings["strong"]["losses"] == 2


def test_ties_both_bad_position_and_judge_agreement() -> None:
    votes = [Vote("x", "y", "a", judge="a"), Vote("x", "y", "a", judge="b"), Vote("y", "x", "b", judge="b"),
             Vote("x", "y", "tie", judge="tie"), Vote("y", "x", "both_bad", judge="tie"), Vote("x", "y", "b")]
    board = leaderboard(votes, rounds=10)
    (pair,) = board["pairs"]
    assert (pair["model"], pair["other"], pair["wins"], pair["losses"], pair["ties"]) == ("x", "y", 3, 1, 2)
    assert pair["win_rate"]["value"] == 3 / 6 and pair["win_rate"]["low"] < 0.5 < pair["win_rate"]["high"]
    assert board["position"]["decisive"] == 4 and board["position"]["left_wins"] == 2  # a, a, b, b
    # the judge saw five: it agreed on a, b (y,x: b), tie, both-bad as tie; disagreed once
    assert board["judge"] == {"compared": 5, "agree": 4, "rate": board["judge"]["rate"]}
    assert board["judge"]["rate"]["value"] == 0.8
    both = {s["model"]: s for s in board["standings"]}
    assert both["x"]["ties"] == 1 and both["x"]["both_bad"] == 1


def test_the_same_votes_give_the_same_board() -> None:
    votes = [Vote("x", "y", "a"), Vote("y", "z", "b"), Vote("z", "x", "tie")] * 3
    assert leaderboard(votes) == leaderboard(list(votes))


def test_a_model_missing_from_a_bootstrap_draw_adds_no_score_to_its_interval() -> None:
    # C beat A once in 31 votes: in many draws C does not play; those draws must not pull its interval to 1000
    votes = [Vote("A", "B", "a")] * 30 + [Vote("C", "A", "a")]
    c = next(s for s in leaderboard(votes, rounds=100)["standings"] if s["model"] == "C")
    assert c["low"] > 1000 and c["low"] <= c["score"] <= c["high"]
