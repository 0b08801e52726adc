"""Which pruning keeps the full grid's winner, and what it saves: recorded full grids replayed through the pruners.

The full grids are bench/sweep_savings.py's space run with no pruner: 12 trials of 40 steps per seed of the random
sampler, every evaluation of each trial kept; seeds 0-5 (tests/sweeps/data/full_grids.json) chose the median's
warm-up, seeds 6-11 (full_grids_heldout.json, recorded after) check it on trials it was not chosen on; the best
pruner's margins were chosen on seeds 0-11, and seeds 12-17 (full_grids_heldout2.json, recorded after) check them.
The sweep's own pruners are replayed as its runner judges them (tunestudio.sweeps.study.replay: its pruner, the
trials one after another, the median's warm-up); other candidates (Optuna's pruners with other settings, and a
hand-written "best completed trial at the same step, with one margin") through the same loop, judged from the step
they name (Hyperband is left out: it puts a trial in a bracket by a hash of the study's random name, so its replays
differ run to run). Per seed the table gives the share of the grid's steps trained and whether the grid's winner
was kept (it completed, or the best completed trial is within 1 % of its objective); a rule is acceptable only if it
keeps it in every seed of every set.
"wall" estimates the wall-time ratio with the costs measured in the same runs: 1.0 s a trial that no pruning saves
(its worker's start, loading, evaluating the base, saving), 0.107 s a step; the worker forkserver's start (5 s and
more, before the first trial) is left out, as bench/sweep_savings.py, which measures it for real, now leaves it out.

    .venv/bin/python bench/pruner_replay.py            # both sets of grids
    # run the full grids again and write them:
    .venv/bin/python bench/pruner_replay.py --grids tests/sweeps/data/full_grids.json --record 0 1 2 3 4 5
    .venv/bin/python bench/pruner_replay.py --grids tests/sweeps/data/full_grids_heldout.json --record 6 7 8 9 10 11
    .venv/bin/python bench/pruner_replay.py --grids tests/sweeps/data/full_grids_heldout2.json \
        --record 12 13 14 15 16 17
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

DATA = ROOT / "tests" / "sweeps" / "data"
GRIDS = DATA / "full_grids.json"
HELD_OUT = DATA / "full_grids_heldout.json"
HELD_OUT2 = DATA / "full_grids_heldout2.json"
TRIAL_S, STEP_S, FIRST_S = 1.0, 0.107, 0.0
Curve = list[tuple[int, float]]


def record(seeds: list[int], grids: Path) -> None:
    from sweep_savings import run_sweep, sweep_body

    out = {"about": "Full grids of bench/sweep_savings.py's space (12 trials of 40 steps, random sampler, learning "
                    "rate log-uniform 1e-5..3e-2 x lora_r {4, 8, 16}, tiny model, LoRA on the bundled alpaca rows, "
                    "eval_loss every 5 steps, no pruner, no early stopping), recorded by bench/pruner_replay.py "
                    f"--record {' '.join(map(str, seeds))}", "objective": "eval_loss", "direction": "minimize",
           "total_steps": 40, "seeds": {}}
    for seed in seeds:
        with tempfile.TemporaryDirectory() as tmp:
            run_sweep(f"seed {seed}", sweep_body(12, 40, False, seed), Path(tmp))
            db = sqlite3.connect(Path(tmp) / "tunestudio.db")
            trials = []
            for job_id, config in db.execute("select id, config from jobs order by created_at").fetchall():
                params = json.loads(config)
                curve = db.execute("select step, eval_loss from metrics where job_id = ? and eval_loss is not null "
                                   "order by step", (job_id,)).fetchall()
                trials.append({"params": {"learning_rate": params["learning_rate"], "lora_r": params["lora_r"]},
                               "curve": [[step, round(value, 4)] for step, value in curve]})
            db.close()
        out["seeds"][str(seed)] = trials
    grids.write_text(json.dumps(out) + "\n")
    print(f"wrote {grids}")


def best_at_step(margin: float) -> Any:
    """A hand-written rule, for comparison: a trial stops when its value is more than `margin` (relative) worse than
    the best completed trial's at the same step (minimising)."""
    import optuna
    from optuna.trial import TrialState

    class BestAtStep(optuna.pruners.BasePruner):
        def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
            step = trial.last_step
            done = [t.intermediate_values[step] for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                    if step in t.intermediate_values] if step is not None else []
            return bool(done) and trial.intermediate_values[step] > min(done) * (1 + margin)

    return BestAtStep()


def candidates() -> dict[str, tuple[Callable[[], Any], int]]:
    """Rules that are not the sweep's, each a pruner factory and the step it judges from."""
    import optuna.pruners as p

    return {
        "percentile 60 (Optuna), from the first training evaluation (step 5)": (
            lambda: p.PercentilePruner(60, n_startup_trials=2), 5),
        "percentile 75 (Optuna), from a quarter of the steps": (lambda: p.PercentilePruner(75, n_startup_trials=2), 10),
        "median (Optuna), from a quarter, 3 startup trials": (lambda: p.MedianPruner(n_startup_trials=3), 10),
        "successive halving (Optuna), min_resource 10, reduction 2": (
            lambda: p.SuccessiveHalvingPruner(min_resource=10, reduction_factor=2), 0),
        "successive halving (Optuna), min_resource 10, reduction 3": (
            lambda: p.SuccessiveHalvingPruner(min_resource=10, reduction_factor=3), 0),
        "successive halving (Optuna), min_resource 15, reduction 4": (
            lambda: p.SuccessiveHalvingPruner(min_resource=15, reduction_factor=4), 0),
        "Wilcoxon (Optuna, experimental), p 0.3": (lambda: p.WilcoxonPruner(p_threshold=0.3), 0),
        "Wilcoxon (Optuna, experimental), p 0.1": (lambda: p.WilcoxonPruner(p_threshold=0.1), 0),
        "Wilcoxon (Optuna, experimental), p 0.5": (lambda: p.WilcoxonPruner(p_threshold=0.5), 0),
        "Wilcoxon (Optuna, experimental), p 0.6": (lambda: p.WilcoxonPruner(p_threshold=0.6), 0),
        "best at the same step + 5 % (hand-written), from a quarter": (lambda: best_at_step(0.05), 10),
        "best at the same step + 10 % (hand-written), from a quarter": (lambda: best_at_step(0.10), 10),
        "best at the same step + 5 % (hand-written), from the first training evaluation": (
            lambda: best_at_step(0.05), 5),
    }


def replay_candidate(make: Callable[[], Any], from_step: int, curves: list[Curve]) -> list[int | None]:
    """study.replay's loop for a pruner that is not the sweep's: judged at every evaluation from `from_step` on."""
    from tunestudio.sweeps import study

    return study.replay_with(make(), "minimize", curves, lambda count, step: step >= from_step)


def judge(stops: list[int | None], curves: list[Curve], total: int, seed: str) -> dict[str, Any]:
    steps = sum(total if stop is None else stop for stop in stops)
    best = min(curve[-1][1] for curve in curves)
    found = min((curve[-1][1] for curve, stop in zip(curves, stops, strict=True) if stop is None), default=None)
    full_wall = FIRST_S + len(curves) * (TRIAL_S + STEP_S * total)
    return {"seed": int(seed), "steps": round(steps / (total * len(curves)), 3),
            "wall": round((FIRST_S + len(curves) * TRIAL_S + STEP_S * steps) / full_wall, 3),
            "kept": found is not None and found <= best * 1.01, "pruned": sum(stop is not None for stop in stops)}


def main() -> None:
    from tunestudio.sweeps import SweepConfig, study

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", type=int, nargs="+", metavar="SEED")
    parser.add_argument("--grids", type=Path, nargs="+", default=[GRIDS, HELD_OUT, HELD_OUT2],
                        help="the recorded grids' files (read; --record writes the one given)")
    args = parser.parse_args()
    if args.record:
        if len(args.grids) != 1:
            parser.error("--record writes one file: name it with --grids PATH")
        record(args.record, args.grids[0])
    sets = {path.name: json.loads(path.read_text()) for path in args.grids}
    totals = {grids["total_steps"] for grids in sets.values()}
    if len(totals) != 1:
        parser.error(f"the grids were recorded at different lengths ({sorted(totals)} steps): replay them apart")
    total = totals.pop()
    curves_of = {label: {seed: [[(s, v) for s, v in t["curve"]] for t in trials]
                         for seed, trials in grids["seeds"].items()} for label, grids in sets.items()}
    ours = {"median, judged from a trial's first training evaluation": ("median", 0.0),
            "median, from a quarter of its steps": ("median", 0.25),
            f"median, from a third (the default: {study.MEDIAN_WARMUP_FRACTION:.3f})": ("median", 1 / 3),
            "median, from half": ("median", 0.5), "successive halving (Optuna's defaults)": ("halving", None),
            "best (the sweep's: the best other trial at the same step + 50 % at a trial's first evaluation, + 10 % "
            "after)": ("best", None)}
    default = study.MEDIAN_WARMUP_FRACTION
    rules: dict[str, Callable[[list[Curve]], list[int | None]]] = {}
    for name, (pruner, fraction) in ours.items():
        config = SweepConfig.model_validate({
            "base": {"model_name": "tiny", "local_datasets": ["x.jsonl"], "max_steps": total, "eval_steps": 5},
            "space": {"learning_rate": {"low": 1e-5, "high": 3e-2, "log": True}, "lora_r": {"values": [4, 8, 16]}},
            "objective": {"metric": "eval_loss", "mode": "min"}, "pruner": pruner, "parallel": 1})

        def replay_ours(curves: list[Curve], config: SweepConfig = config, fraction: float | None = fraction) -> Any:
            study.MEDIAN_WARMUP_FRACTION = default if fraction is None else fraction
            try:
                return study.replay(config, curves, total)
            finally:
                study.MEDIAN_WARMUP_FRACTION = default

        rules[name] = replay_ours
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna's ExperimentalWarning (Wilcoxon)
        for name, (make, from_step) in candidates().items():
            rules[name] = lambda curves, make=make, from_step=from_step: replay_candidate(make, from_step, curves)
        results: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for name, replay in rules.items():
            results[name] = {}
            for label, seeds in curves_of.items():
                results[name][label] = [judge(replay(curves), curves, total, seed) for seed, curves in seeds.items()]
            rows = [row for per_set in results[name].values() for row in per_set]
            print(f"{name}: kept the winner in {sum(r['kept'] for r in rows)} of {len(rows)}; " + " | ".join(
                f"{label}: steps {min(r['steps'] for r in per_set):.2f}-{max(r['steps'] for r in per_set):.2f} "
                f"(mean {sum(r['steps'] for r in per_set) / len(per_set):.2f}), wall ~"
                f"{min(r['wall'] for r in per_set):.2f}-{max(r['wall'] for r in per_set):.2f}"
                + "".join(f", seed {r['seed']} LOST" for r in per_set if not r["kept"])
                for label, per_set in results[name].items()), flush=True)
    print(json.dumps({"bench": "pruner_replay", "grids": [str(path) for path in args.grids], "rules": results}))


if __name__ == "__main__":
    main()
