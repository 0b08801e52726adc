"""CPU seconds a fresh training process spends importing, with and without the optional libraries its job does not
use (worker/optional.py: bitsandbytes, which peft imports when installed and which loads torch's compiler, and
wandb, which trl imports when installed).

Each round starts two fresh interpreters that import what a spawned worker imports before its first step
(`tunestudio.worker.main` and the training modules), one as a LoRA job on the tiny model now does (the two hidden),
one as before (nothing hidden), in alternating order, and reads their CPU time (user + system, from
getrusage of the children: less noisy than wall time on a shared machine). Every fresh process pays this: a
spawned worker, each torchrun rank, each Ray worker; a worker forked from the prewarmed forkserver pays none.

    .venv/bin/python bench/worker_imports.py [--rounds 5]

Prints each round, the medians and their ratio, and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "models" / "tiny-llama"

SCRIPT = """
import json, sys
config = {"model_name": sys.argv[1], "training_type": "lora", "optim": "adamw_torch"}
if sys.argv[2] == "hidden":
    from tunestudio.worker.optional import hide_unused
    hide_unused(config)
import tunestudio.worker.main, tunestudio.worker.train.model, tunestudio.worker.train.train
print(json.dumps(sorted(m for m in ("bitsandbytes", "wandb", "torch._inductor.compile_fx") if sys.modules.get(m))))
"""


def cpu_seconds(mode: str) -> tuple[float, list[str]]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(TINY), mode], capture_output=True, text=True,
                          check=True, cwd=REPO)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return used, json.loads(proc.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    seconds: dict[str, list[float]] = {"hidden": [], "all": []}
    loaded: dict[str, list[str]] = {}
    for round_ in range(args.rounds):
        order = ("hidden", "all") if round_ % 2 == 0 else ("all", "hidden")
        for mode in order:
            used, loaded[mode] = cpu_seconds(mode)
            seconds[mode].append(used)
        print(f"round {round_ + 1}: hidden {seconds['hidden'][-1]:.2f} s, all {seconds['all'][-1]:.2f} s of CPU")
    hidden, everything = statistics.median(seconds["hidden"]), statistics.median(seconds["all"])
    print(f"median CPU seconds of a fresh worker's imports: {hidden:.2f} hidden vs {everything:.2f} "
          f"({hidden / everything:.3f}x, {everything - hidden:.2f} s saved a process)")
    print(f"loaded with them hidden: {loaded['hidden'] or 'none'}; without: {loaded['all']}")
    print(json.dumps({"bench": "worker_imports", "rounds": args.rounds, "cpu_s_hidden": round(hidden, 3),
                      "cpu_s_all": round(everything, 3), "ratio": round(hidden / everything, 3),
                      "saved_s": round(everything - hidden, 3), "loaded_hidden": loaded["hidden"],
                      "loaded_all": loaded["all"]}))


if __name__ == "__main__":
    main()
