"""Time from submit to the first `training` phase: cold (spawn) against prewarmed (forkserver).

Both run here, in one process, on the embedded tiny model, alternating
cold/warm so machine noise hits both alike. The prewarmed figure is the
steady state of a running server: the forkserver was started (and preloaded)
when the manager started; the wait for that first preload is reported apart.

    .venv/bin/python bench/startup.py [--rounds 3]

Target (issue 7): prewarmed ≤ 0.25 × cold. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tunestudio.config import JobConfig  # noqa: E402
from tunestudio.jobs.manager import JobManager  # noqa: E402
from tunestudio.settings import Settings  # noqa: E402


def _build(directory: str) -> None:
    from tunestudio.worker.tiny import build_tiny_model

    build_tiny_model(directory)


def time_to_training(manager: JobManager, cfg: JobConfig) -> float:
    started = time.monotonic()
    job = manager.submit(cfg)
    to_training = None
    with manager.subscribe(job.id) as stream:
        while True:
            event = stream.get(timeout=600)
            assert event is not None, "the job went quiet"
            if event.kind == "status" and event.data["status"] == "training" and to_training is None:
                to_training = time.monotonic() - started
            if event.is_end:
                assert event.data["status"] == "completed", event.data
                break
    assert to_training is not None
    return to_training


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    proc = mp.get_context("spawn").Process(target=_build, args=(str(work / "tiny"),))
    proc.start()
    proc.join()
    cfg = JobConfig.model_validate({
        "model_name": str(work / "tiny"), "local_datasets": [str(REPO / "examples/data/alpaca.jsonl")],
        "max_steps": 2, "batch_size": 8, "gradient_accumulation_steps": 1, "max_seq_length": 128,
    })
    cold = JobManager(Settings(home=work / "cold", prewarm=False)).start()
    warm = JobManager(Settings(home=work / "warm", prewarm=True)).start()
    try:
        first_warm = time_to_training(warm, cfg)  # includes waiting for the forkserver's preload
        cold_times, warm_times = [], []
        for _ in range(args.rounds):
            cold_times.append(time_to_training(cold, cfg))
            warm_times.append(time_to_training(warm, cfg))
    finally:
        cold.close()
        warm.close()
    cold_s, warm_s = statistics.median(cold_times), statistics.median(warm_times)
    ratio = warm_s / cold_s
    print(f"cold (spawn):        median {cold_s:.2f}s  {[round(t, 2) for t in cold_times]}")
    print(f"prewarmed (fork):    median {warm_s:.2f}s  {[round(t, 2) for t in warm_times]}")
    print(f"first prewarmed job: {first_warm:.2f}s (waits for the server's preload)")
    print(f"ratio prewarmed/cold: {ratio:.3f} (target <= 0.25)")
    print(json.dumps({"bench": "startup", "cold_s": round(cold_s, 3), "prewarmed_s": round(warm_s, 3),
                      "first_prewarmed_s": round(first_warm, 3), "ratio": round(ratio, 3), "target": 0.25,
                      "rounds": args.rounds, "met": ratio <= 0.25}))


if __name__ == "__main__":
    main()
