"""The tool-calling demo: the embedded tiny model learns to call two tools (issue 41, goal: call accuracy on the
held-out questions from 0 % to at least 80 %).

Runs examples/tools.yaml as `tunestudio train` would (a JobManager, a fresh data directory) on the bundled tool
rows (examples/data/tools.jsonl; worker/tiny_tools.py writes them), and reads the job's before/after evaluation on
examples/data/tools_eval.jsonl:

- call accuracy: tool_args on the held-out rows whose reference is a call: the share whose call names the right
  function with arguments equal, as JSON, to the reference's;
- tool_choice (called where it should, answered where it should), tool_name, tool_arg_match (each argument);
- the whole loop: exact match of the answer given after a call and its result (rows whose prompt holds a
  `tool` turn), from the job's rows file.

What the figure measures: every argument value (six cities, the amounts 1 to 9, four currencies) trains; each
held-out question puts them together in a way training never shows (a city in a phrasing it was never asked in,
an amount-from-to triple that never trains). The tiny model learns lookups, not copying, so the figure is about
choosing the tool and filling each argument from the question for known values, not about values never seen.

The model: models/tiny-llama when its chat template writes tool calls, else one built here from worker/tiny.py
(the same weights: the template is not part of the pre-training). Prints the figures and one JSON line.

    TUNESTUDIO_TORCH_THREADS=1 .venv/bin/python bench/tools_demo.py [--steps N] [--lr X] [--scheduler S] [--keep]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from studio_job import run_job_file  # noqa: E402  (bench/, this script's folder)

JOB = REPO / "examples" / "tools.yaml"
DATA = REPO / "examples" / "data"
GOAL = 0.8
FIGURES = ("tool_args", "tool_choice", "tool_name", "tool_arg_match", "exact_match")


def _build(directory: str) -> None:
    from tunestudio.worker.tiny import build_tiny_model

    build_tiny_model(directory)


def tool_model(work: Path) -> Path:
    """models/tiny-llama if its template writes tool calls, else the same model built in `work` (a child builds
    it, as `tunestudio make-tiny-model` does: this process stays free of torch)."""
    built = REPO / "models" / "tiny-llama"
    template = built / "chat_template.jinja"
    if template.is_file() and "<tool_call>" in template.read_text(encoding="utf-8"):
        return built
    directory = work / "tiny-llama"
    proc = mp.get_context("spawn").Process(target=_build, args=(str(directory),))
    proc.start()
    proc.join()
    assert proc.exitcode == 0, "building the tiny model failed"
    return directory


def loop_answers(rows_file: str) -> dict[str, float | None]:
    """Exact match, before and after, of the answers given after a call's result (the whole loop)."""
    rows = json.loads(Path(rows_file).read_text(encoding="utf-8"))["rows"]
    loop = [r for r in rows if r.get("answer") is not None and any(m.get("role") == "tool" for m in r["messages"])]
    if not loop:
        return {"before": None, "after": None, "rows": 0}
    return {"before": sum(r["exact_match_before"] for r in loop) / len(loop),
            "after": sum(r["exact_match"] for r in loop) / len(loop), "rows": len(loop)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, help="max_steps (default: examples/tools.yaml's)")
    parser.add_argument("--lr", type=float, help="learning_rate (default: examples/tools.yaml's)")
    parser.add_argument("--scheduler", help="lr_scheduler_type (default: examples/tools.yaml's)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args()
    chosen = (("max_steps", args.steps), ("learning_rate", args.lr), ("lr_scheduler_type", args.scheduler))
    overrides = {k: v for k, v in chosen if v is not None}
    work = Path(tempfile.mkdtemp(prefix="bench-tools-"))
    try:
        model = tool_model(work)
        done = run_job_file(JOB, model, DATA, "tools.jsonl", "tools_eval.jsonl", work, overrides)
        evaluation = done["job"].result["evaluation"]
        metrics = {name: evaluation["metrics"].get(name) for name in FIGURES}
        loop = loop_answers(evaluation["rows_file"])
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    config = done["config"]
    calls = metrics["tool_args"] or {}
    print(f"model {model}, {config.training_type.value} fine-tune, {config.max_steps} steps, lr {config.learning_rate},"
          f" {done['seconds']:.0f} s; {evaluation['rows']} held-out rows")
    for name, figure in metrics.items():
        if figure:
            print(f"  {name:15s} {figure['before']:7.1%} -> {figure['after']:7.1%}")
    if loop["rows"]:
        print(f"  {'loop answers':15s} {loop['before']:7.1%} -> {loop['after']:7.1%} ({loop['rows']} rows)")
    print(json.dumps({"bench": "tools_demo", "goal": GOAL, "goal_met": (calls.get("after") or 0) >= GOAL,
                      "call_accuracy": calls, "metrics": metrics, "loop_answers": loop, "steps": config.max_steps,
                      "learning_rate": config.learning_rate,
                      "scheduler": config.lr_scheduler_type, "training_type": config.training_type.value,
                      "seconds": round(done["seconds"], 1), "held_out_rows": evaluation["rows"]}))


if __name__ == "__main__":
    main()
