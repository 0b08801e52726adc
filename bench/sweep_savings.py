"""Sweeps: the wall time pruning and early stopping save on a 12-trial sweep, and the best objective each reaches.

Two sweeps of the same 12 trials (the random sampler with one seed draws the same params whatever happened
before, so both sweeps try the same points) on the embedded tiny model (models/tiny-llama, `make setup`), LoRA
on the bundled alpaca rows, objective eval_loss (min), one trial at a time through a JobManager's queue:

- baseline: no pruner, no early stopping: every trial trains its max_steps;
- savings: a pruner (`--pruner`: median, the default, a trial worse than the median of the completed ones at the
  same evaluation stops, with a save; best, one more than a margin behind the best other trial there) and early
  stopping on eval_loss (patience 2) in every trial.

Figures: each sweep's wall time (create → completed, the clock started once the worker forkserver is up, as a
running server's is: before 2026-12-06 the process's first sweep, seed 0's baseline, counted its start and no other
sweep did, since the forkserver outlives a JobManager), the steps its trials trained, how many were pruned or
stopped early, the best eval_loss; the ratio of wall times (savings / baseline). Run it on a quiet machine
(`uptime`): every trial is a real worker on 2 cores.

    .venv/bin/python bench/sweep_savings.py                 # 12 trials of 40 steps
    .venv/bin/python bench/sweep_savings.py --trials 4 --steps 30   # a quick look
    .venv/bin/python bench/sweep_savings.py --seeds 0 1 2           # issue 40: over three seeds
    .venv/bin/python bench/sweep_savings.py --seeds 0 1 2 --pruner best

Per seed it prints the wall-time ratio and whether pruning kept the full grid's winner (the same trial, or an
objective within 1 %), and the pruned trials with the value and step they were stopped at. Last, what a trial costs
besides its steps (a line fitted through every trial's wall time against its steps, `trial_costs`), the wall ratio
those costs give each seed's steps, and the per-trial cost at which it would be 0.5.

The last line of output is one JSON object with all figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TINY = ROOT / "models" / "tiny-llama"
DATA = ROOT / "examples" / "data" / "alpaca.jsonl"


def sweep_body(trials: int, steps: int, savings: bool, seed: int = 0, pruner: str = "median") -> dict[str, Any]:
    base: dict[str, Any] = {
        "model_name": str(TINY), "local_datasets": [str(DATA)], "training_type": "lora", "max_steps": steps,
        "eval_steps": max(1, steps // 8), "eval_generate_rows": 0, "batch_size": 8, "max_seq_length": 128,
        "logging_steps": max(1, steps // 8), "lora_alpha": 32, "warmup_steps": 5, "lr_scheduler_type": "cosine",
        "train_on_completions": True, "random_seed": 7, "precision": "fp32",
    }
    if savings:
        base["early_stopping"] = {"metric": "eval_loss", "patience": 2}
    return {"base": base,
            "space": {"learning_rate": {"low": 1e-5, "high": 3e-2, "log": True}, "lora_r": {"values": [4, 8, 16]}},
            "sampler": "random", "seed": seed, "n_trials": trials, "objective": {"metric": "eval_loss", "mode": "min"},
            "pruner": pruner if savings else "none", "parallel": 1}


def run_sweep(name: str, body: dict[str, Any], home: Path) -> dict[str, Any]:
    from tunestudio.jobs import prewarm
    from tunestudio.jobs.manager import JobManager
    from tunestudio.settings import Settings
    from tunestudio.sweeps import SweepConfig, Sweeps

    settings = Settings(home=home, max_concurrent_jobs=1)
    with JobManager(settings) as manager, Sweeps(manager, poll_seconds=0.2) as sweeps:
        # The clock starts once the worker forkserver is up, as a running server's is: its start (its imports, 5-12 s
        # here) is the server's, paid once whatever sweeps follow (the process's first sweep only: it outlives a
        # JobManager); it is reported beside. warm_up returns once its probe fork does, after the imports.
        started = time.monotonic()
        if settings.prewarm:
            prewarm.warm_up().join()
        warm_up = time.monotonic() - started
        started = time.monotonic()
        sweep_id = sweeps.create(SweepConfig.model_validate(body)).id
        while (view := sweeps.get(sweep_id)).status not in ("completed", "stopped"):
            time.sleep(0.5)
        wall = time.monotonic() - started
        ran = [(t, manager.get(t.job_id)) for t in view.trials if t.job_id]
        jobs = [j for _, j in ran]
        # each trial's job, submitted to ended, against the steps it trained: what trial_costs fits
        trial_times = [[t.steps or 0, round(j.finished_at - j.created_at, 3)] for t, j in ran
                       if j.finished_at is not None]
        early = sum(1 for j in jobs if (j.result or {}).get("best") and j.message and "early" in j.message.lower())
        steps = sum(t.steps or 0 for t in view.trials)
    figures = {"wall_s": round(wall, 1), "forkserver_start_s": round(warm_up, 1), "trials": len(view.trials),
               "completed": sum(t.status == "completed" for t in view.trials),
               "pruned": sum(t.status == "pruned" for t in view.trials),
               "failed": sum(t.status == "failed" for t in view.trials), "stopped_early": early,
               "steps_trained": steps, "trial_times": trial_times,
               "best_eval_loss": view.best.value if view.best else None,
               "best_params": view.best.params if view.best else None,
               "pruned_trials": [{"params": t.params, "value": t.value, "pruned_at": t.pruned_at, "steps": t.steps}
                                 for t in view.trials if t.status == "pruned"]}
    print(f"{name}: {json.dumps(figures)}", flush=True)
    return figures


def same_best(baseline: dict[str, Any], savings: dict[str, Any]) -> dict[str, Any]:
    """Whether pruning kept the full grid's winner: the same trial (its params), or an objective within 1 %."""
    full, kept = baseline["best_eval_loss"], savings["best_eval_loss"]
    gap = None if full is None or kept is None else (kept - full) / abs(full)
    return {"same_trial": baseline["best_params"] == savings["best_params"],
            "relative_gap": None if gap is None else round(gap, 4),
            "kept": baseline["best_params"] == savings["best_params"] or (gap is not None and gap <= 0.01)}


def trial_costs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """What a trial costs besides its steps, and what that leaves pruning: a line fitted through every trial of
    every sweep run (its job's wall time, submitted to ended, against the steps it trained: pruned trials give the
    short ones), intercept `per_trial_s` (start, loading, the base's evaluation, saving, the hand-over) and slope
    `per_step_s` (a step and its share of the evaluations). Per seed, `costs_only` is the wall ratio these costs
    give for the steps each sweep trained (pruned trials' stops cost a little more than a completion), and
    `per_trial_s_for_half` the per-trial cost at which the ratio would be 0.5 with the same steps (negative: no
    per-trial cost can bring it there, the steps alone are more than half)."""
    points = [tuple(p) for run in runs for arm in ("baseline", "savings") for p in run[arm]["trial_times"]]
    if len({steps for steps, _ in points}) < 2:  # every trial trained as long: no line to fit
        return {"per_trial_s": None, "per_step_s": None, "trials": len(points), "seeds": []}
    steps, walls = zip(*points, strict=True)
    slope, intercept = statistics.linear_regression(steps, walls)
    seeds = []
    for run in runs:
        full, kept = run["baseline"], run["savings"]
        trials, full_steps = full["trials"], full["steps_trained"]
        ratio = (kept["trials"] * intercept + kept["steps_trained"] * slope) / (trials * intercept + full_steps * slope)
        spare = kept["trials"] - 0.5 * trials
        half = slope * (0.5 * full_steps - kept["steps_trained"]) / spare if spare > 0 else None
        seeds.append({"seed": run["seed"], "costs_only": round(ratio, 3),
                      "per_trial_s_for_half": None if half is None else round(half, 2)})
    return {"per_trial_s": round(intercept, 2), "per_step_s": round(slope, 3), "trials": len(points),
            "seeds": seeds}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0],
                        help="the sampler's seeds: each draws another 12 trials, run both ways (issue 40: 0 1 2)")
    parser.add_argument("--pruner", choices=["median", "best", "halving"], default="median",
                        help="the pruner of the sweep with savings (the baseline has none)")
    args = parser.parse_args()
    if not (TINY / "config.json").is_file():
        sys.exit(f"{TINY} is missing: make setup builds it")
    load = os.getloadavg()
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", flush=True)
    runs = []
    for seed in args.seeds:
        with tempfile.TemporaryDirectory(prefix="sweep-bench-") as tmp:
            baseline = run_sweep(f"seed {seed}: baseline (no pruner, no early stopping)",
                                 sweep_body(args.trials, args.steps, False, seed), Path(tmp) / "baseline")
            savings = run_sweep(f"seed {seed}: pruner {args.pruner} + early stopping",
                                sweep_body(args.trials, args.steps, True, seed, args.pruner), Path(tmp) / "savings")
        run = {"seed": seed, "baseline": baseline, "savings": savings,
               "wall_ratio": round(savings["wall_s"] / baseline["wall_s"], 3),
               "steps_ratio": round(savings["steps_trained"] / max(1, baseline["steps_trained"]), 3),
               "best": same_best(baseline, savings)}
        print(f"seed {seed}: wall time {savings['wall_s']} s with pruning and early stopping vs {baseline['wall_s']} "
              f"s without (ratio {run['wall_ratio']}); best eval_loss {savings['best_eval_loss']} vs "
              f"{baseline['best_eval_loss']} ({'kept' if run['best']['kept'] else 'LOST'}: same trial "
              f"{run['best']['same_trial']}, gap {run['best']['relative_gap']})", flush=True)
        runs.append(run)
    load_after = os.getloadavg()
    costs = trial_costs(runs)
    if costs["per_trial_s"] is not None:
        print(f"a trial costs {costs['per_trial_s']} s besides its steps, a step {costs['per_step_s']} s (fitted over "
              f"{costs['trials']} trials); per seed, the wall ratio those costs give and the per-trial cost that "
              "would make it 0.5: " + "; ".join(f"seed {s['seed']}: {s['costs_only']}, {s['per_trial_s_for_half']} s"
                                                for s in costs["seeds"]), flush=True)
    result = {"trials": args.trials, "max_steps": args.steps, "pruner": args.pruner, "runs": runs, "costs": costs,
              "wall_ratio_max": max(r["wall_ratio"] for r in runs),
              "best_kept": sum(r["best"]["kept"] for r in runs), "seeds": len(runs),
              "load_before": round(load[0], 2), "load_after": round(load_after[0], 2)}
    print(f"over {len(runs)} seeds: wall ratio at most {result['wall_ratio_max']}; the full grid's best kept in "
          f"{result['best_kept']} of {len(runs)}", flush=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
