"""Which pruning keeps the full grid's winner, and what it saves: recorded full grids replayed through the pruners.

The full grids (tests/sweeps/data/full_grids.json) are bench/sweep_savings.py's space run with no pruner: 12 trials
of 40 steps for each of the random sampler's seeds 0-5, every evaluation of each trial kept. Each pruner is replayed
on them as the sweep's runner judges (tunestudio.sweeps.study.replay: Optuna's pruner, the trials one after another)
and the table gives, per seed, the share of the grid's steps trained and whether the grid's winner was kept.
"wall" estimates the wall-time ratio with the costs measured in the same runs: 1.0 s a trial that no pruning saves
(its worker's start, loading, evaluating the base, saving), 0.107 s a step, and 5 s more for the first trial (the
forkserver's first worker); bench/sweep_savings.py measures it for real.

    .venv/bin/python bench/pruner_replay.py
    .venv/bin/python bench/pruner_replay.py --record 0 1 2 3 4 5   # run the full grids again and write the file
    .venv/bin/python bench/pruner_replay.py --grids tests/sweeps/data/full_grids_heldout.json --record 6 7 8 9 10 11
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

GRIDS = ROOT / "tests" / "sweeps" / "data" / "full_grids.json"
TRIAL_S, STEP_S, FIRST_S = 1.0, 0.107, 5.0


def record(seeds: list[int], grids: Path) -> None:
    from sweep_savings import run_sweep, sweep_body

    out = {"about": "Full grids of bench/sweep_savings.py's space (12 trials of 40 steps, random sampler, learning "
                    "rate log-uniform 1e-5..3e-2 x lora_r {4, 8, 16}, tiny model, LoRA on the bundled alpaca rows, "
                    "eval_loss every 5 steps, no pruner, no early stopping), recorded by bench/pruner_replay.py "
                    "--record", "objective": "eval_loss", "direction": "minimize", "total_steps": 40, "seeds": {}}
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


def main() -> None:
    from tunestudio.sweeps import SweepConfig, study

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", type=int, nargs="+", metavar="SEED")
    parser.add_argument("--grids", type=Path, default=GRIDS,
                        help="the recorded grids' file (read, or written by --record); default %(default)s")
    args = parser.parse_args()
    if args.record:
        record(args.record, args.grids)
    grids = json.loads(args.grids.read_text())
    total = grids["total_steps"]
    rules = {"median, judged from a trial's first training evaluation": ("median", 0.0),
             "median, from a quarter of its steps": ("median", 0.25),
             f"median, from a third (the default: {study.MEDIAN_WARMUP_FRACTION:.3f})": ("median", 1 / 3),
             "median, from half": ("median", 0.5), "successive halving (Optuna's defaults)": ("halving", None)}
    default = study.MEDIAN_WARMUP_FRACTION
    results = {}
    try:
        for name, (pruner, fraction) in rules.items():
            study.MEDIAN_WARMUP_FRACTION = default if fraction is None else fraction
            config = SweepConfig.model_validate({
                "base": {"model_name": "tiny", "local_datasets": ["x.jsonl"], "max_steps": total, "eval_steps": 5},
                "space": {"learning_rate": {"low": 1e-5, "high": 3e-2, "log": True}, "lora_r": {"values": [4, 8, 16]}},
                "objective": {"metric": "eval_loss", "mode": "min"}, "pruner": pruner, "parallel": 1})
            rows = []
            for seed, trials in grids["seeds"].items():
                curves = [[(s, v) for s, v in t["curve"]] for t in trials]
                stops = study.replay(config, curves, total)
                steps = sum(total if stop is None else stop for stop in stops)
                winner = min(range(len(curves)), key=lambda i: curves[i][-1][1])
                full_wall = FIRST_S + len(curves) * (TRIAL_S + STEP_S * total)
                rows.append({"seed": int(seed), "steps": round(steps / (total * len(curves)), 3),
                             "wall": round((FIRST_S + len(curves) * TRIAL_S + STEP_S * steps) / full_wall, 3),
                             "kept": stops[winner] is None, "pruned": sum(stop is not None for stop in stops)})
            results[name] = rows
            print(f"{name}: kept the winner in {sum(r['kept'] for r in rows)} of {len(rows)}; " + " | ".join(
                f"seed {r['seed']}: steps {r['steps']:.2f}, wall ~{r['wall']:.2f}{'' if r['kept'] else ' LOST'}"
                for r in rows), flush=True)
    finally:
        study.MEDIAN_WARMUP_FRACTION = default
    print(json.dumps({"bench": "pruner_replay", "grids": str(args.grids), "rules": results}))


if __name__ == "__main__":
    main()
