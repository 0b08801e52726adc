"""Torch threads on a shared CPU: seconds per training step of the tiny model on 1 thread and on every core,
quiet and beside a busy neighbour (one process spinning on a core, as a test's server or a second job does).

Why TUNESTUDIO_TORCH_THREADS exists (tunestudio.process.torch_threads) and why the test suite runs on 1: OpenMP
threads spin while they wait for each other, so a thread per core beside other work can be far slower than
fewer. Each setting runs in a fresh child (a thread pool cannot be resized cleanly in-process), alternated over
the rounds; the figures are medians. Prints one JSON line.

    .venv/bin/python bench/threads.py --rounds 3 --steps 30
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STEP = """
import sys, time, torch
from transformers import AutoModelForCausalLM
torch.set_num_threads(int(sys.argv[1]))
model = AutoModelForCausalLM.from_pretrained(sys.argv[2])
ids = torch.randint(0, model.config.vocab_size, (8, 64), generator=torch.Generator().manual_seed(0))
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
def step():
    model(input_ids=ids, labels=ids).loss.backward(); opt.step(); opt.zero_grad()
for _ in range(3):
    step()
start = time.perf_counter()
for _ in range(int(sys.argv[3])):
    step()
print((time.perf_counter() - start) / int(sys.argv[3]))
"""


def _spin(stop: mp.Event) -> None:  # type: ignore[valid-type]
    while not stop.is_set():
        sum(range(10_000))


def seconds_per_step(threads: int, model: str, steps: int) -> float:
    out = subprocess.run([sys.executable, "-c", STEP, str(threads), model, str(steps)], capture_output=True,
                         text=True, check=True, env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(REPO / "models" / "tiny-llama"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    figures: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for busy in (False, True):
            stop = mp.get_context("spawn").Event()
            neighbour = mp.get_context("spawn").Process(target=_spin, args=(stop,)) if busy else None
            if neighbour is not None:
                neighbour.start()
                time.sleep(0.5)
            try:
                for threads in sorted({1, cores}):
                    key = f"{'busy' if busy else 'quiet'}_{threads}_threads"
                    figures.setdefault(key, []).append(seconds_per_step(threads, args.model, args.steps))
            finally:
                if neighbour is not None:
                    stop.set()
                    neighbour.join()
    medians = {key: statistics.median(values) for key, values in figures.items()}
    for key, value in medians.items():
        print(f"{key}: {value * 1000:.1f} ms a step (rounds: {', '.join(f'{v * 1000:.0f}' for v in figures[key])})")
    ratio = {state: medians[f"{state}_{cores}_threads"] / medians[f"{state}_1_threads"]
             for state in ("quiet", "busy") if cores > 1}
    print(json.dumps({"bench": "threads", "cores": cores, "steps": args.steps, "rounds": args.rounds,
                      "seconds_per_step": medians, "all_cores_over_one": ratio}))


if __name__ == "__main__":
    main()
