"""A dataset preview's wall time: its child forked from the warm worker forkserver (what api/preview.py does once
`jobs.warm_context` says the forkserver's preload is done) against a spawned interpreter (before that, or with
prewarm off), on the bundled alpaca rows, alternating, after the forkserver is warm.

    .venv/bin/python bench/preview_fork.py [--rounds 5]

Prints each side's times, the medians and their ratio, and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> None:
    import tunestudio.jobs
    from tunestudio.api import preview
    from tunestudio.jobs import prewarm

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    config = {"local_datasets": [str(REPO / "examples" / "data" / "alpaca.jsonl")]}
    warm = tunestudio.jobs.warm_context
    prewarm.warm_up().join(600)
    if warm() is None:
        raise SystemExit("the forkserver did not become warm (prewarm off, or a GPU here: bench/preview_fork.py "
                         "compares nothing)")
    times: dict[str, list[float]] = {"spawned": [], "forked": []}
    for round_ in range(args.rounds):
        for side in ("spawned", "forked") if round_ % 2 == 0 else ("forked", "spawned"):
            tunestudio.jobs.warm_context = warm if side == "forked" else (lambda: None)
            start = time.perf_counter()
            answer = preview.preview_rows(config, 5)
            times[side].append(time.perf_counter() - start)
            assert "error" not in answer, answer
    medians = {side: statistics.median(values) for side, values in times.items()}
    ratio = medians["forked"] / medians["spawned"]
    print(f"spawned {[round(t, 3) for t in times['spawned']]} s, forked {[round(t, 3) for t in times['forked']]} s")
    print(f"median: spawned {medians['spawned']:.3f} s, forked {medians['forked']:.3f} s: {ratio:.2f}x")
    print(json.dumps({"bench": "preview_fork", "rounds": times, "median_s": medians, "ratio": round(ratio, 3)}))


if __name__ == "__main__":
    main()
