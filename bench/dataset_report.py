"""The dataset report on a 50k-row file: how long it takes, against reading the same file.

Generates an alpaca JSONL file (seeded: instructions of 6–30 words and answers of 15–120 words from a
3,000-word vocabulary, with 1 % exact and 1 % near duplicates planted), then alternates, for --rounds:

- baseline: a spawned child that reads the file with the worker's own loader (`read_rows`: imports and
  JSON parsing, what any job pays to read its data);
- tokenising: a spawned child that reads and converts the rows as a job does, then tokenises each one as
  TRL's SFTTrainer does when a job starts (`apply_chat_template(prompt + completion, tokenize=True)` row by
  row): the work a job does on this data before its first step, which the report also does;
- report: `tunestudio.data_report.run_report` (the CLI's and the API's path): a spawned child that reads,
  converts, tokenises with the embedded tiny model's tokenizer (chat template included), finds exact and
  near duplicates and the held-out split's overlap, and answers the report as JSON.

It checks the report found the planted duplicates (at least as many as planted), prints the times, the
report's ratio to each baseline and its own compute time (without the child's imports), and ends with one
JSON line.

    .venv/bin/python bench/dataset_report.py [--rows 50000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tunestudio import paths  # noqa: E402
from tunestudio.data_report import ReportRequest, run_report  # noqa: E402

TINY = REPO / "models" / "tiny-llama"


def generate(path: Path, rows: int, seed: int = 0) -> dict[str, int]:
    """Write `rows` alpaca rows; returns how many exact and near duplicates were planted."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocabulary = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(3000)]
    words = lambda n: " ".join(rng.choice(vocabulary) for _ in range(n))  # noqa: E731
    written: list[dict[str, str]] = []
    planted = {"exact": 0, "near": 0}
    with path.open("w", encoding="utf-8") as fh:
        for _ in range(rows):
            roll = rng.random()
            if written and roll < 0.01:
                row = dict(rng.choice(written))
                planted["exact"] += 1
            elif written and roll < 0.02:
                base = rng.choice(written)
                answer = base["output"].split()
                answer[-1] = rng.choice(vocabulary)  # one word of a long answer changed
                row = {**base, "output": " ".join(answer)}
                planted["near"] += 1
            else:
                row = {"instruction": words(rng.randint(6, 30)), "input": "", "output": words(rng.randint(15, 120))}
            written.append(row)
            fh.write(json.dumps(row) + "\n")
    return planted


def _read(path: str, done: mp.Queue) -> None:
    from tunestudio.config import JobConfig
    from tunestudio.worker.data.sources import read_rows

    rows = read_rows(JobConfig.model_validate({"model_name": "none", "local_datasets": [path]}))
    done.put(len(rows.train))


def _tokenise(path: str, done: mp.Queue) -> None:
    from transformers import AutoTokenizer

    from tunestudio.config import JobConfig
    from tunestudio.worker.data.formats import resolve_format
    from tunestudio.worker.data.sources import read_rows

    cfg = JobConfig.model_validate({"model_name": str(TINY), "local_datasets": [path]})
    rows = read_rows(cfg).train
    _, convert, _ = resolve_format(cfg, rows)
    tokenizer = AutoTokenizer.from_pretrained(str(TINY))
    total = 0
    for row in rows:
        example = convert(row.data)
        total += len(tokenizer.apply_chat_template(example["prompt"] + example["completion"], tokenize=True,
                                                   return_dict=True)["input_ids"])
    done.put(total)


def baseline(path: Path, target=_read) -> float:
    ctx = mp.get_context("spawn")
    done = ctx.Queue()
    started = time.monotonic()
    proc = ctx.Process(target=target, args=(str(path), done))
    proc.start()
    count = done.get(timeout=600)
    proc.join(60)
    assert count > 0
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if not (TINY / "config.json").is_file():
        sys.exit(f"build the tiny model first: .venv/bin/tunestudio make-tiny-model {TINY}")
    work = Path(tempfile.mkdtemp(prefix="bench-report-"))
    path = work / "rows.jsonl"
    planted = generate(path, args.rows)
    print(f"{args.rows:,} rows, {path.stat().st_size / 1e6:.1f} MB; planted {planted['exact']} exact and "
          f"{planted['near']} near duplicates")
    config = paths.resolve(ReportRequest(local_datasets=[str(path)], model_name=str(TINY), max_seq_length=512,
                                         held_out=True).job_config())
    base_s, tokenise_s, report_s, compute_s = [], [], [], []
    report = {}
    for round_ in range(1, args.rounds + 1):
        base_s.append(baseline(path))
        tokenise_s.append(baseline(path, _tokenise))
        started = time.monotonic()
        report = run_report(config, tokenize=True, timeout_s=1800)
        report_s.append(time.monotonic() - started)
        compute_s.append(report["seconds"])
        print(f"round {round_}: read {base_s[-1]:.2f} s, read and tokenise as TRL {tokenise_s[-1]:.2f} s, "
              f"report {report_s[-1]:.2f} s (of which computing {compute_s[-1]:.2f} s)")
    dup = report["duplicates"]
    assert report["rows"] == args.rows, report["rows"]
    assert dup["exact"] >= planted["exact"] and dup["near"] >= planted["near"], (dup, planted)
    read, made, tokenise = statistics.median(base_s), statistics.median(report_s), statistics.median(tokenise_s)
    print(f"found {dup['exact']} exact, {dup['near']} near duplicates; lengths {report['lengths']['min']}–"
          f"{report['lengths']['max']} tokens, keep_99 {report['lengths']['keep_99']}; eval overlap "
          f"{report['eval_overlap']['exact']} exact, {report['eval_overlap']['near']} near")
    print(f"median: read {read:.2f} s, read and tokenise as TRL {tokenise:.2f} s, report {made:.2f} s; "
          f"report / read {made / read:.2f}, report / tokenise {made / tokenise:.2f}")
    print(json.dumps({"bench": "dataset_report", "rows": args.rows, "read_s": round(read, 2),
                      "tokenise_s": round(tokenise, 2), "report_s": round(made, 2),
                      "report_compute_s": round(statistics.median(compute_s), 2), "ratio": round(made / read, 2),
                      "ratio_to_tokenise": round(made / tokenise, 2), "exact": dup["exact"], "near": dup["near"],
                      "planted": planted}))


if __name__ == "__main__":
    main()
