"""The reward-model demo: a score head on the embedded tiny model learns which answer goes with which lookup
question (issue 44, goal: held-out accuracy from about 50 % to at least 90 %).

Runs examples/reward.yaml as `tunestudio train` would (a JobManager, a fresh data directory) on the bundled pairs
(examples/data/reward_pairs.jsonl; worker/tiny_rewards.py writes them) and reads the job's before/after evaluation
on examples/data/reward_pairs_eval.jsonl: accuracy (the share of held-out pairs whose chosen answer scores above
the rejected one) and the mean margin (chosen minus rejected).

What the figure measures: both answers of a pair are of the question's kind (two colours, two animal sounds...);
the held-out questions are the training questions (the lookup tables are small), but no held-out (question, chosen,
rejected) triple trains: each pits a question's right answer against a wrong one it was never paired with there.

    TUNESTUDIO_TORCH_THREADS=1 .venv/bin/python bench/reward_demo.py [--steps N] [--lr X] [--lora] [--keep]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from studio_job import run_job_file  # noqa: E402  (bench/, this script's folder)

JOB = REPO / "examples" / "reward.yaml"
DATA = REPO / "examples" / "data"
MODEL = REPO / "models" / "tiny-llama"
GOAL = 0.9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, help="max_steps (default: examples/reward.yaml's)")
    parser.add_argument("--lr", type=float, help="learning_rate (default: examples/reward.yaml's)")
    parser.add_argument("--lora", action="store_true", help="LoRA (score head trained whole) instead of full")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args()
    chosen = (("max_steps", args.steps), ("learning_rate", args.lr), ("training_type", "lora" if args.lora else None))
    overrides = {k: v for k, v in chosen if v is not None}
    work = Path(tempfile.mkdtemp(prefix="bench-reward-"))
    try:
        done = run_job_file(JOB, MODEL, DATA, "reward_pairs.jsonl", "reward_pairs_eval.jsonl", work, overrides)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    config, evaluation = done["config"], done["job"].result["evaluation"]
    accuracy, margin = evaluation["metrics"]["accuracy"], evaluation["metrics"]["margin"]
    print(f"{config.training_type.value} fine-tune, {config.max_steps} steps, lr {config.learning_rate}, "
          f"{done['seconds']:.0f} s; {evaluation['rows']} held-out pairs")
    print(f"  accuracy {accuracy['before']:7.1%} -> {accuracy['after']:7.1%}")
    print(f"  margin   {margin['before']:7.3f} -> {margin['after']:7.3f}")
    print(json.dumps({"bench": "reward_demo", "goal": GOAL, "goal_met": (accuracy["after"] or 0) >= GOAL,
                      "accuracy": accuracy, "margin": margin, "steps": config.max_steps,
                      "learning_rate": config.learning_rate, "training_type": config.training_type.value,
                      "seconds": round(done["seconds"], 1), "held_out_pairs": evaluation["rows"]}))


if __name__ == "__main__":
    main()
