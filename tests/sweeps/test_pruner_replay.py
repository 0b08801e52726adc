"""The sweep's pruner against the full grid's ranking: recorded full grids (the sweep bench's space, 12 trials of 40
steps, every trial trained to its end: tests/sweeps/data/full_grids.json, random sampler seeds 0-5, which the rule
was chosen on, and full_grids_heldout.json, seeds 6-11, recorded after to check it) replayed through the pruner as
the runner judges it (study.replay). No job runs: Optuna's own pruners on recorded curves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tunestudio.sweeps import SweepConfig
from tunestudio.sweeps.study import judged, replay

from ..helpers.jobs import DATA

DATA_DIR = Path(__file__).parent / "data"
GRIDS = json.loads((DATA_DIR / "full_grids.json").read_text())
HELD_OUT = json.loads((DATA_DIR / "full_grids_heldout.json").read_text())
SEEDS = {**GRIDS["seeds"], **HELD_OUT["seeds"]}  # seeds 0-11, each drawn once


def config(pruner: str) -> SweepConfig:
    return SweepConfig.model_validate({
        "base": {"model_name": "tiny", "local_datasets": [str(DATA / "alpaca.jsonl")], "max_steps": 40,
                 "eval_steps": 5},
        "sampler": "random",
        "space": {"learning_rate": {"low": 1e-5, "high": 3e-2, "log": True}, "lora_r": {"values": [4, 8, 16]}},
        "objective": {"metric": "eval_loss", "mode": "min"}, "pruner": pruner, "parallel": 1})


def test_the_held_out_grids_are_the_same_space_on_other_seeds() -> None:
    assert HELD_OUT["total_steps"] == GRIDS["total_steps"] and not set(HELD_OUT["seeds"]) & set(GRIDS["seeds"])
    assert len(SEEDS) == 12 and all(len(trials) == 12 for trials in SEEDS.values())


@pytest.mark.parametrize("seed", sorted(SEEDS, key=int))
def test_the_median_pruner_keeps_the_full_grid_s_winner_and_stops_the_clearly_worse(seed: str) -> None:
    trials = SEEDS[seed]
    curves = [[(step, value) for step, value in t["curve"]] for t in trials]
    stops = replay(config("median"), curves, GRIDS["total_steps"])
    winner = min(range(len(curves)), key=lambda i: curves[i][-1][1])
    # the winner itself completes (stricter than the "or within 1 % of its objective")
    assert stops[winner] is None, (seed, trials[winner]["params"], stops)
    pruned = [i for i, stop in enumerate(stops) if stop is not None]
    assert len(pruned) >= 3, stops
    assert all(stops[i] >= GRIDS["total_steps"] / 3 for i in pruned), stops  # never before a third of the steps
    # and it kept the runner-up too: no trial it stopped would have ended among the grid's best two
    ranked = sorted(range(len(curves)), key=lambda i: curves[i][-1][1])
    assert not set(ranked[:2]) & set(pruned), (ranked[:2], stops)


def test_the_warm_up_is_a_third_of_a_job_s_steps_and_two_evaluations() -> None:
    assert not judged("median", 1, 20, 40) and judged("median", 2, 20, 40)  # the base's evaluation and one more
    assert not judged("median", 3, 13, 40) and judged("median", 3, 14, 40)
    assert judged("median", 4, 10, 30)  # exactly a third
    assert judged("median", 2, 1, None) and judged("median", 2, 1, 0)  # no total known: the evaluations decide
    assert judged("halving", 1, 1, 40) and judged("none", 1, 1, 40)  # the median pruner's warm-up only


def test_no_pruner_stops_nothing() -> None:
    curves = [[(step, value) for step, value in t["curve"]] for t in GRIDS["seeds"]["0"]]
    assert replay(config("none"), curves, GRIDS["total_steps"]) == [None] * len(curves)
