"""Rows per minute of a data-making run at 1, 4 and 8 requests in flight, and the share of its time spent outside
the teacher (issue 43's performance figure; target: under 10%).

The teacher is the tests' scripted OpenAI-compatible server (tests/helpers/teacher.py) on loopback, each reply held
for `--latency` seconds, as a local llama.cpp or a hosted API would take to write it: a teacher whose own speed does
not depend on how many requests are in flight, so what is measured is ours (the pool, HTTP, parsing, the gates,
appending the rows). The run is the real worker recipe in this process (tunestudio.worker.make_data.run), task qa on
the bundled handbook, no judge. Two figures: `outside_teacher` = 1 - (the time at least one request was inside the
teacher, the union of the server's request intervals) / wall time, the share the issue asks for; and `vs_ideal` =
1 - (requests x latency / concurrency) / wall time, which also charges the rounds left part-full (the last rows
asked, fewer than `concurrency` at once). Prints one JSON line per concurrency.

Usage: /work/runtest .venv/bin/python bench/make_data_rate.py [--rows 48] [--latency 0.2]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers.channel import ListChannel  # noqa: E402
from tests.helpers.server import loopback_v1  # noqa: E402
from tests.helpers.teacher import Teacher  # noqa: E402
from tunestudio.make_data_config import MakeDataConfig, report_file  # noqa: E402
from tunestudio.worker.make_data import run  # noqa: E402
from tunestudio.worker.tiny_docs import write_docs  # noqa: E402

SPANS: list[tuple[float, float]] = []  # each request's time inside the teacher (perf_counter)


def teacher_with(latency: float) -> type[Teacher]:
    class Held(Teacher):
        def do_POST(self) -> None:
            started = time.perf_counter()
            time.sleep(latency)
            super().do_POST()
            SPANS.append((started, time.perf_counter()))

    return Held


def covered(spans: list[tuple[float, float]]) -> float:
    """The length of the union of the intervals."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(spans):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def measure(url: str, docs: dict[str, Path], out: Path, rows: int, concurrency: int, latency: float) -> dict:
    cfg = MakeDataConfig.model_validate({
        "sources": [str(docs[k]) for k in ("md", "html", "pdf", "docx")], "task": "qa", "rows": rows,
        "chunk_size": 300, "chunk_overlap": 50, "output": str(out), "concurrency": concurrency,
        "teacher": {"base_url": url, "model": "good"}, "gates": {"dedupe": "near", "min_answer_chars": 1}})
    SPANS.clear()
    started = time.perf_counter()
    code = run(cfg, ListChannel(), {})
    wall = time.perf_counter() - started
    inside = covered(SPANS)
    report = json.loads(report_file(out).read_text())
    ideal = report["requests"] * latency / concurrency
    return {"concurrency": concurrency, "exit": code, "rows_made": report["rows_made"], "requests": report["requests"],
            "removed": report["removed"], "wall_s": round(wall, 3), "rows_per_minute": round(60 * report["rows_made"]
                                                                                            / wall, 1),
            "teacher_latency_s": latency, "outside_teacher": round(1 - inside / wall, 4),
            "vs_ideal": round(1 - ideal / wall, 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=48)
    parser.add_argument("--latency", type=float, default=0.2)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="make-data-rate-"))
    docs = write_docs(tmp / "docs")
    with loopback_v1(teacher_with(args.latency)) as url:
        for concurrency in (1, 4, 8):
            out = tmp / f"c{concurrency}.jsonl"
            print(json.dumps(measure(url, docs, out, args.rows, concurrency, args.latency)), flush=True)


if __name__ == "__main__":
    main()
