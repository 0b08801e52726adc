"""The garbage collector in a worker: what freezing the worker's imports (worker/child.py `freeze_imports`) saves.

A worker forked from the forkserver holds every object of its preload (torch, transformers, trl, peft: about
560,000). A full collection walks them all: accelerate runs one as training starts, and the collector's own
generation-2 runs come while a job trains or a chat answers. `freeze_imports` moves them out of its sight.

Each round runs the same tiny LoRA jobs (models/tiny-llama, the bundled alpaca rows, 10 steps, an evaluation every
step, 1 torch thread) through a JobManager as the server does, in a fresh process per arm (the forkserver keeps the
environment it started with): TUNESTUDIO_GC_FREEZE=0 (the collector sees everything, as before), then the default;
the arms alternate. Inside each worker a `gc.callbacks` hook (installed by this script through a sitecustomize on
PYTHONPATH, which the forkserver imports at its start) adds up the time of every collection and writes it to a file
when a worker ends (it is forked: a hook at fork starts its count at zero). Figures: per arm, the median job wall
time (submit -> completed), the median CPU time of its worker (user and system, from its fork to its exit) and the
median time it spent collecting.

It measures forked workers, the default on a CPU; a machine with a GPU spawns its workers, which this bench does not
count (its hook hears only processes forked after it loaded).

    .venv/bin/python bench/worker_gc.py                  # 3 rounds of 4 jobs per arm
    .venv/bin/python bench/worker_gc.py --rounds 1 --jobs 2

The last line of output is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "models" / "tiny-llama"
DATA = ROOT / "examples" / "data" / "alpaca.jsonl"

# Loaded by every interpreter started with this folder on PYTHONPATH (the forkserver included); each process forked
# from it inherits the hook and writes its collections' total when it ends through the job's path (os._exit skips
# atexit, so the worker's own `sys.exit` path is patched: multiprocessing ends a forked child with os._exit).
SITECUSTOMIZE = '''
import gc, os, time
_state = {"start": 0.0, "total": 0.0, "runs": 0, "pid": os.getpid()}
def _hook(phase, info):
    if phase == "start":
        _state["start"] = time.perf_counter()
    else:
        _state["total"] += time.perf_counter() - _state["start"]
        _state["runs"] += 1
gc.callbacks.append(_hook)
def _reset():
    cpu = os.times()
    _state.update(total=0.0, runs=0, cpu=cpu.user + cpu.system)
os.register_at_fork(after_in_child=_reset)
_exit = os._exit
def _recorded_exit(code):
    if os.getpid() != _state["pid"] and os.environ.get("GC_BENCH_OUT"):
        with open(os.environ["GC_BENCH_OUT"], "a") as out:
            cpu = os.times()
            out.write(f"{os.getpid()} {_state['total']:.4f} {_state['runs']} {gc.get_freeze_count()} "
                      f"{cpu.user + cpu.system - _state['cpu']:.3f}\\n")
    _exit(code)
os._exit = _recorded_exit
'''


def arm(jobs: int) -> tuple[list[float], list[int]]:
    """Run in a fresh process: `jobs` tiny jobs one after another; their wall times and worker pids."""
    from tunestudio.config import JobConfig
    from tunestudio.jobs import prewarm
    from tunestudio.jobs.manager import JobManager
    from tunestudio.settings import Settings

    config = JobConfig.model_validate({
        "model_name": str(TINY), "local_datasets": [str(DATA)], "training_type": "lora", "max_steps": 10,
        "eval_steps": 1, "eval_generate_rows": 0, "batch_size": 8, "max_seq_length": 128, "learning_rate": 1e-3,
        "lora_r": 4, "train_on_completions": True, "random_seed": 7, "precision": "fp32"})
    walls, pids = [], []
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(home=Path(tmp), max_concurrent_jobs=1)
        with JobManager(settings) as manager:
            if settings.prewarm:
                prewarm.warm_up().join()
            for _ in range(jobs):
                started = time.monotonic()
                job = manager.submit(config)
                while (job := manager.get(job.id)).status.is_live:
                    time.sleep(0.02)
                if job.status.value != "completed":
                    sys.exit(f"job {job.id} ended {job.status.value}: {job.error}")
                walls.append(time.monotonic() - started)
                pids.append(job.worker_pid)
    return walls, pids


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--arm", choices=["run"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:
        print(json.dumps(arm(args.jobs)))
        return
    if not (TINY / "config.json").is_file():
        sys.exit(f"{TINY} is missing: make setup builds it")
    figures: dict[str, dict[str, list[float]]] = {arm_: {"wall": [], "gc": [], "cpu": []}
                                                  for arm_ in ("seen", "frozen")}
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "sitecustomize.py").write_text(SITECUSTOMIZE)
        for round_ in range(args.rounds):
            for name, freeze in (("seen", "0"), ("frozen", "1")):
                out = Path(tmp) / f"{name}-{round_}.txt"
                env = {**os.environ, "TUNESTUDIO_GC_FREEZE": freeze, "GC_BENCH_OUT": str(out),
                       "TUNESTUDIO_TORCH_THREADS": "1", "PYTHONPATH": f"{tmp}{os.pathsep}{ROOT}"}
                run = subprocess.run([sys.executable, __file__, "--arm", "run", "--jobs", str(args.jobs)], env=env,
                                     capture_output=True, text=True, check=True)
                walls, pids = json.loads(run.stdout.strip().splitlines()[-1])
                rows = [line.split() for line in out.read_text().splitlines()] if out.exists() else []
                rows = [r for r in rows if int(r[0]) in pids]  # the jobs' workers (not the forkserver's probe)
                gc_s = [float(r[1]) for r in rows]
                figures[name]["wall"] += walls
                figures[name]["gc"] += gc_s
                figures[name]["cpu"] += [float(r[4]) for r in rows]
                print(f"round {round_} {name}: job wall {[round(w, 2) for w in walls]} s; the workers' CPU "
                      f"{[float(r[4]) for r in rows]} s, collecting {[round(g, 3) for g in gc_s]} s (frozen objects "
                      f"{[int(r[3]) for r in rows]})", flush=True)
    result: dict[str, Any] = {
        arm_: {"wall_median_s": round(statistics.median(f["wall"]), 3),
               "cpu_median_s": round(statistics.median(f["cpu"]), 3) if f["cpu"] else None,
               "gc_median_s": round(statistics.median(f["gc"]), 4) if f["gc"] else None, "jobs": len(f["wall"])}
        for arm_, f in figures.items()}
    result["wall_ratio"] = round(result["frozen"]["wall_median_s"] / result["seen"]["wall_median_s"], 3)
    if result["frozen"]["cpu_median_s"] and result["seen"]["cpu_median_s"]:
        result["cpu_ratio"] = round(result["frozen"]["cpu_median_s"] / result["seen"]["cpu_median_s"], 3)
    print(f"job wall time, frozen / seen: {result['wall_ratio']} (medians {result['frozen']['wall_median_s']} vs "
          f"{result['seen']['wall_median_s']} s); the worker's CPU: {result.get('cpu_ratio')} (medians "
          f"{result['frozen']['cpu_median_s']} vs {result['seen']['cpu_median_s']} s); time collecting per worker: "
          f"{result['frozen']['gc_median_s']} vs {result['seen']['gc_median_s']} s")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
