"""How fast the job list answers during a flood of dataset previews (issue 30's check, moved out of the tests
by issue 40: a wall-clock bound is a benchmark). 60 previews, each child held 1 s, against a real server on
127.0.0.1; 20 GET /api/jobs timed during it. Baseline: the same 20 requests with no flood, same server process.
Target: p99 during the flood under 100 ms.

    .venv/bin/python bench/preview_flood.py [--rounds 3]

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.helpers.flood import FLOOD, flood_previews  # noqa: E402
from tests.helpers.server import running_server  # noqa: E402
from tunestudio.settings import Settings  # noqa: E402


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98]


def quiet_list(home: Path, asks: int = 20) -> list[float]:
    took = []
    with running_server(Settings(home=home)) as url, httpx.Client(base_url=url, timeout=60) as client:
        client.get("/api/jobs")
        for _ in range(asks):
            t0 = time.perf_counter()
            client.get("/api/jobs")
            took.append(time.perf_counter() - t0)
    return took


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    rounds = parser.parse_args().rounds
    flooded, quiet = [], []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as monkeypatch:
            quiet += quiet_list(Path(tmp) / "quiet")
            result = flood_previews(Path(tmp) / "home", monkeypatch)
            flooded += result.took
            print(f"round: {result.statuses.count(200)} x 200, {result.statuses.count(429)} x 429 of {FLOOD}; "
                  f"the job list answered during the flood: {result.during}")
    figures = {"flood_p50_ms": statistics.median(flooded) * 1000, "flood_p99_ms": p99(flooded) * 1000,
               "quiet_p50_ms": statistics.median(quiet) * 1000, "quiet_p99_ms": p99(quiet) * 1000}
    figures["p99_ratio"] = figures["flood_p99_ms"] / figures["quiet_p99_ms"]
    verdict = "met" if figures["flood_p99_ms"] < 100 else "missed"
    print(f"GET /api/jobs during a flood of {FLOOD} previews: p50 {figures['flood_p50_ms']:.1f} ms, p99 "
          f"{figures['flood_p99_ms']:.1f} ms (quiet: p50 {figures['quiet_p50_ms']:.1f}, p99 "
          f"{figures['quiet_p99_ms']:.1f}); target p99 < 100 ms: {verdict}")
    print(json.dumps({k: round(v, 2) for k, v in figures.items()}))


if __name__ == "__main__":
    main()
