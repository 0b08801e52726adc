"""How fast a Parquet decompression bomb is refused (issue 30's check, moved out of the tests by issue 40: a
wall-clock bound is a benchmark; tests/worker/test_dataset_bounds.py keeps what is refused and the memory it
takes). Each of the two bombs (20 rows of one 50 MB string: 1 GB of rows; zstd: 2 KB on disk, found from its
metadata; snappy: 2.3 MB, found as its rows decode) is read in a fresh process as the worker reads it
(`prepare`) and as the preview does (its child). Bound: each refused within 30 s (decoding one took minutes
and 3.9 GB before issue 30).

    .venv/bin/python bench/dataset_bounds.py [--rounds 3]

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.helpers.parquet_bomb import read_in_child, write_bomb  # noqa: E402

BOUND_S = 30.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-bounds-"))
    results = {}
    for compression in ("zstd", "snappy"):
        bomb = write_bomb(folder / f"bomb-{compression}.parquet", compression)
        for reader in ("worker", "preview"):
            runs = [read_in_child(reader, bomb) for _ in range(args.rounds)]
            assert all(str(bomb) in r["answer"] for r in runs), runs  # refused, naming the file
            seconds = [r["seconds"] for r in runs]
            results[f"{reader}-{compression}"] = {"median_s": round(statistics.median(seconds), 2),
                                                  "max_s": round(max(seconds), 2),
                                                  "peak_mb": round(max(r["peak_mb"] for r in runs))}
            print(f"{reader}, {compression} bomb of {bomb.stat().st_size:,} bytes: refused in "
                  f"{statistics.median(seconds):.2f} s median ({', '.join(f'{s:.2f}' for s in seconds)}), peak "
                  f"{results[f'{reader}-{compression}']['peak_mb']} MB")
    worst = max(r["max_s"] for r in results.values())
    print(f"slowest refusal {worst:.2f} s; bound {BOUND_S:.0f} s: {'met' if worst < BOUND_S else 'MISSED'}")
    print(json.dumps({"bench": "dataset_bounds", "bound_s": BOUND_S, "met": worst < BOUND_S, **results}))


if __name__ == "__main__":
    main()
