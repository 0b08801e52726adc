"""CPU seconds a benchmark's worker spends finding its tasks: lm_eval's own TaskManager against the worker's
`task_manager` (worker/bench.py), which keeps the index of lm_eval's ~14,700 bundled task files in the cache folder
and indexes only the user's eval file each run.

Each round starts two fresh interpreters, in alternating order: one builds `TaskManager(include_path=...)` as lm_eval
does (every bundled YAML file parsed), one calls `task_manager(include, cache)` with the cache already written (the
state of every benchmark after the first on a data directory). Both find the same eval-file task and the same
standard one. CPU time (user + system, from getrusage of the children) is less noisy than wall time on a shared
machine. The first, cache-writing call is timed once, before the rounds.

    .venv/bin/python bench/bench_tasks.py [--rounds 3]

Prints each round, the medians and their ratio, and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SCRIPT = """
import json, sys
from pathlib import Path
from tunestudio.worker.bench import custom_task, task_manager
work = Path(sys.argv[2])
include = work / "tasks"
name = custom_task(work / "answers.jsonl", include, True)
if sys.argv[1] == "lm_eval":
    from lm_eval.tasks import TaskManager
    manager = TaskManager(include_path=str(include))
else:
    manager = task_manager(include, work / "cache")
print(json.dumps({"found": [t in manager.task_index for t in (name, "arc_easy")], "tasks": len(manager.all_tasks)}))
"""


def cpu_seconds(mode: str, work: Path) -> tuple[float, dict]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, mode, str(work)], capture_output=True, text=True,
                          cwd=REPO, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, json.loads(proc.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "answers.jsonl").write_text(json.dumps({"question": "2 + 2?", "answer": "4"}) + "\n")
        first, seen = cpu_seconds("cached", work)  # builds and writes the cache
        print(f"first run, cache written: {first:.2f} s of CPU ({seen})")
        times: dict[str, list[float]] = {"lm_eval": [], "cached": []}
        for round_ in range(args.rounds):
            order = ("lm_eval", "cached") if round_ % 2 == 0 else ("cached", "lm_eval")
            for mode in order:
                cpu, seen = cpu_seconds(mode, work)
                assert seen["found"] == [True, True], seen
                times[mode].append(cpu)
            print(f"round {round_ + 1}: lm_eval's TaskManager {times['lm_eval'][-1]:.2f} s, "
                  f"cached {times['cached'][-1]:.2f} s of CPU ({seen['tasks']} tasks)")
    medians = {mode: statistics.median(values) for mode, values in times.items()}
    ratio = medians["cached"] / medians["lm_eval"]
    print(f"median: lm_eval's TaskManager {medians['lm_eval']:.2f} s, cached {medians['cached']:.2f} s: {ratio:.2f}x")
    print(json.dumps({"bench": "bench_tasks", "first_s": round(first, 2), "rounds": times,
                      "median_s": medians, "ratio": round(ratio, 3)}))


if __name__ == "__main__":
    main()
