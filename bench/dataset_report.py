"""The dataset report on a generated file: how long it takes and how much memory, against reading and against
tokenising the same file.

Two shapes (--shape):

- planted (default, 50k rows): alpaca JSONL (seeded: instructions of 6–30 words and answers of 15–120 words
  from a 3,000-word vocabulary, with 1 % exact and 1 % near duplicates planted);
- short (issue 38 finding 5, 1M rows): `{"instruction": "q<i>", "output": "a<i % 1000>"}`, every row distinct.

For --rounds it alternates:

- baseline: a spawned child that reads the file with the worker's own loader (`read_rows`: imports and
  JSON parsing, what any job pays to read its data);
- tokenising: a spawned child that reads and converts the rows as a job does, then tokenises each one as
  TRL's SFTTrainer does when a job starts (`apply_chat_template(prompt + completion, tokenize=True)` row by
  row): the work a job does on this data before its first step, which the report also does;
- report: `tunestudio.data_report.run_report` with its own bounds (REPORT_TIMEOUT_S, REPORT_MAX_RSS), the CLI's
  and the API's path, called in a spawned child whose only child is the report's, so that its peak resident
  memory (ru_maxrss of the children) is the report's: reads, converts, tokenises with the embedded tiny
  model's tokenizer (chat template included), finds exact and near duplicates and the held-out split's
  overlap, and answers the report as JSON.

It checks the report's counts exactly, as the tests do: every row read and usable and none refused; exactly
the exact and near duplicates planted (none in the short shape); the rows max_seq_length cuts and the tokens
lost, as the tokenising baseline counts them row by row; the 128 held-out rows, and how many of them repeat a
training row exactly (the same content) or nearly (a row of the same planted family), from the generator's
own record. Then it prints the times, rows per second, the report's peak memory, its ratio to each baseline
and its own compute time (without the child's imports), and ends with one JSON line.

    .venv/bin/python bench/dataset_report.py [--rows 50000] [--rounds 2]
    .venv/bin/python bench/dataset_report.py --shape short --rows 1000000 --rounds 1
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
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tunestudio.config import ReportSpec  # noqa: E402
from tunestudio.data_report import resolved, run_report  # noqa: E402

TINY = REPO / "models" / "tiny-llama"
MAX_SEQ_LENGTH = 512


@dataclass
class Generated:
    planted: dict[str, int]  # exact and near duplicates planted
    contents: list[str] = field(default_factory=list)  # each row's content, in the file's order
    families: list[int] = field(default_factory=list)  # each row's first ancestor: its copies and near copies share it


def generate(path: Path, rows: int, seed: int = 0) -> Generated:
    """Write `rows` alpaca rows, recording which are copies or near copies of which."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocabulary = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(3000)]
    words = lambda n: " ".join(rng.choice(vocabulary) for _ in range(n))  # noqa: E731
    written: list[dict[str, str]] = []
    made = Generated({"exact": 0, "near": 0})
    with path.open("w", encoding="utf-8") as fh:
        for number in range(rows):
            roll = rng.random()
            family = number
            if written and roll < 0.01:
                at = rng.randrange(len(written))  # as rng.choice(written) picks
                row, family = dict(written[at]), made.families[at]
                made.planted["exact"] += 1
            elif written and roll < 0.02:
                at = rng.randrange(len(written))
                base, family = written[at], made.families[at]
                answer = base["output"].split()
                answer[-1] = rng.choice(vocabulary)  # one word of a long answer changed
                row = {**base, "output": " ".join(answer)}
                made.planted["near"] += 1
            else:
                row = {"instruction": words(rng.randint(6, 30)), "input": "", "output": words(rng.randint(15, 120))}
            written.append(row)
            made.contents.append(json.dumps(row, sort_keys=True))
            made.families.append(family)
            fh.write(json.dumps(row) + "\n")
    return made


def generate_short(path: Path, rows: int) -> Generated:
    """Write the finding's file: `rows` short alpaca rows, all distinct."""
    made = Generated({"exact": 0, "near": 0})
    with path.open("w", encoding="utf-8") as fh:
        for number in range(rows):
            row = {"instruction": f"q{number}", "output": f"a{number % 1000}"}
            made.contents.append(json.dumps(row, sort_keys=True))
            made.families.append(number)
            fh.write(json.dumps(row) + "\n")
    return made


def expected_overlap(made: Generated, seed: int) -> tuple[int, int, int]:
    """(held-out rows, those repeating a training row exactly, those repeating one nearly): the job's split of
    the rows (none refused, no dedupe), compared by the generator's record, not by the report's code."""
    from tunestudio.worker.data import eval_size, hold_out

    n = len(made.contents)
    train, held = hold_out(list(range(n)), eval_size(n, None), seed)
    contents = {made.contents[i] for i in train}
    families = {made.families[i] for i in train}
    exact = sum(made.contents[i] in contents for i in held)
    near = sum(made.contents[i] not in contents and made.families[i] in families for i in held)
    return len(held), exact, near


def _read(path: str, done: mp.Queue) -> None:
    from tunestudio.worker.data.sources import read_rows

    rows = read_rows(ReportSpec(local_datasets=[path]))
    done.put(len(rows.train))


def _tokenise(path: str, done: mp.Queue) -> None:
    from transformers import AutoTokenizer

    from tunestudio.worker.data.formats import resolve_format
    from tunestudio.worker.data.sources import read_rows

    spec = ReportSpec(local_datasets=[path])
    rows = read_rows(spec).train
    _, convert, _ = resolve_format(spec, rows)
    tokenizer = AutoTokenizer.from_pretrained(str(TINY))
    lengths = []
    for row in rows:
        example = convert(row.data)
        lengths.append(len(tokenizer.apply_chat_template(example["prompt"] + example["completion"], tokenize=True,
                                                         return_dict=True)["input_ids"]))
    over = [n - MAX_SEQ_LENGTH for n in lengths if n > MAX_SEQ_LENGTH]
    done.put({"rows": len(lengths), "cut_rows": len(over), "cut_tokens": sum(over)})


def _report(path: str, done: mp.Queue) -> None:
    """run_report with its own bounds, from a child whose only child is the report's: its ru_maxrss of children
    is the report's peak resident memory."""
    import resource

    spec = resolved(ReportSpec(local_datasets=[path], model_name=str(TINY), max_seq_length=MAX_SEQ_LENGTH,
                               held_out=True))
    started = time.monotonic()
    report = run_report(spec)
    seconds = time.monotonic() - started
    done.put({"report": report, "seconds": seconds,
              "peak_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024})


def baseline(path: Path, target=_read) -> tuple[float, object]:
    """(seconds, what the child found) of a spawned child doing target's work on the file."""
    ctx = mp.get_context("spawn")
    done = ctx.Queue()
    started = time.monotonic()
    proc = ctx.Process(target=target, args=(str(path), done))
    proc.start()
    found = done.get(timeout=1800)
    proc.join(60)
    assert found
    return time.monotonic() - started, found


def check(report: dict, made: Generated, counted: object, rows: int) -> None:
    """The report's counts, exactly: rows, duplicates planted, lengths as counted row by row, the overlap."""
    dup, lengths, overlap = report["duplicates"], report["lengths"], report["eval_overlap"]
    assert (report["rows"], report["usable"], report["refused_count"]) == (rows, rows, 0), report
    assert (dup["exact"], dup["near"]) == (made.planted["exact"], made.planted["near"]), (dup, made.planted)
    measured = {"rows": lengths["rows"], "cut_rows": lengths["cut_rows"], "cut_tokens": lengths["cut_tokens"]}
    assert measured == counted and sum(lengths["histogram"]["counts"]) == rows, (measured, counted)
    held, exact, near = expected_overlap(made, ReportSpec(local_datasets=["x"]).random_seed)
    assert (overlap["eval_rows"], overlap["exact"], overlap["near"]) == (held, exact, near), (overlap, exact, near)
    print(f"found exactly the {dup['exact']} exact and {dup['near']} near duplicates planted; lengths "
          f"{lengths['min']}–{lengths['max']} tokens, keep_99 {lengths['keep_99']}, max_seq_length {MAX_SEQ_LENGTH} "
          f"cuts {lengths['cut_rows']} rows ({lengths['cut_tokens']} tokens), as counted row by row; eval overlap of "
          f"the {held} held-out rows: {overlap['exact']} exact, {overlap['near']} near, as the generator's record "
          "says")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", choices=["planted", "short"], default="planted")
    parser.add_argument("--rows", type=int, default=None, help="default: 50,000 planted, 1,000,000 short")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    rows = args.rows or (50_000 if args.shape == "planted" else 1_000_000)
    if not (TINY / "config.json").is_file():
        sys.exit(f"build the tiny model first: .venv/bin/tunestudio make-tiny-model {TINY}")
    path = Path(tempfile.mkdtemp(prefix="bench-report-")) / "rows.jsonl"
    made = generate(path, rows) if args.shape == "planted" else generate_short(path, rows)
    print(f"{args.shape}: {rows:,} rows, {path.stat().st_size / 1e6:.1f} MB; planted {made.planted['exact']} exact "
          f"and {made.planted['near']} near duplicates")
    read_s, tokenise_s, report_s, compute_s, peak = [], [], [], [], []
    for round_ in range(1, args.rounds + 1):
        read_s.append(baseline(path)[0])
        seconds, counted = baseline(path, _tokenise)
        tokenise_s.append(seconds)
        found = baseline(path, _report)[1]
        assert isinstance(found, dict)
        report = found["report"]
        report_s.append(found["seconds"])
        compute_s.append(report["seconds"])
        peak.append(found["peak_mib"])
        print(f"round {round_}: read {read_s[-1]:.2f} s, read and tokenise as TRL {tokenise_s[-1]:.2f} s, "
              f"report {report_s[-1]:.2f} s (of which computing {compute_s[-1]:.2f} s), report's peak memory "
              f"{peak[-1]:.0f} MiB")
        check(report, made, counted, rows)
    read, made_s, tokenise = statistics.median(read_s), statistics.median(report_s), statistics.median(tokenise_s)
    print(f"median: read {read:.2f} s, read and tokenise as TRL {tokenise:.2f} s, report {made_s:.2f} s "
          f"({rows / made_s:,.0f} rows/s, peak {max(peak):.0f} MiB); report / read {made_s / read:.2f}, "
          f"report / tokenise {made_s / tokenise:.2f}")
    print(json.dumps({"bench": "dataset_report", "shape": args.shape, "rows": rows, "read_s": round(read, 2),
                      "tokenise_s": round(tokenise, 2), "report_s": round(made_s, 2),
                      "report_compute_s": round(statistics.median(compute_s), 2),
                      "rows_per_s": round(rows / made_s), "peak_mib": round(max(peak)),
                      "ratio": round(made_s / read, 2), "ratio_to_tokenise": round(made_s / tokenise, 2),
                      "exact": report["duplicates"]["exact"], "near": report["duplicates"]["near"],
                      "cut_rows": report["lengths"]["cut_rows"],
                      "overlap": [report["eval_overlap"]["exact"], report["eval_overlap"]["near"]],
                      "planted": made.planted}))


if __name__ == "__main__":
    main()
