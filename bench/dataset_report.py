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

It checks the report's counts exactly, as the tests do: every row read and usable and none refused; exactly
the exact and near duplicates planted; the rows max_seq_length cuts and the tokens lost, as the tokenising
baseline counts them row by row; the 128 held-out rows, and how many of them repeat a training row exactly
(the same content) or nearly (a row of the same planted family), from the generator's own record. Then it
prints the times, the report's ratio to each baseline and its own compute time (without the child's
imports), and ends with one JSON line.

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


def baseline(path: Path, target=_read) -> tuple[float, object]:
    """(seconds, what the child found) of a spawned child doing target's work on the file."""
    ctx = mp.get_context("spawn")
    done = ctx.Queue()
    started = time.monotonic()
    proc = ctx.Process(target=target, args=(str(path), done))
    proc.start()
    found = done.get(timeout=600)
    proc.join(60)
    assert found
    return time.monotonic() - started, found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if not (TINY / "config.json").is_file():
        sys.exit(f"build the tiny model first: .venv/bin/tunestudio make-tiny-model {TINY}")
    work = Path(tempfile.mkdtemp(prefix="bench-report-"))
    path = work / "rows.jsonl"
    generated = generate(path, args.rows)
    planted = generated.planted
    print(f"{args.rows:,} rows, {path.stat().st_size / 1e6:.1f} MB; planted {planted['exact']} exact and "
          f"{planted['near']} near duplicates")
    spec = resolved(ReportSpec(local_datasets=[str(path)], model_name=str(TINY), max_seq_length=MAX_SEQ_LENGTH,
                               held_out=True))
    base_s, tokenise_s, report_s, compute_s = [], [], [], []
    report: dict = {}
    counted: object = None
    for round_ in range(1, args.rounds + 1):
        base_s.append(baseline(path)[0])
        seconds, counted = baseline(path, _tokenise)
        tokenise_s.append(seconds)
        started = time.monotonic()
        report = run_report(spec, timeout_s=1800)
        report_s.append(time.monotonic() - started)
        compute_s.append(report["seconds"])
        print(f"round {round_}: read {base_s[-1]:.2f} s, read and tokenise as TRL {tokenise_s[-1]:.2f} s, "
              f"report {report_s[-1]:.2f} s (of which computing {compute_s[-1]:.2f} s)")
    dup, lengths, overlap = report["duplicates"], report["lengths"], report["eval_overlap"]
    assert (report["rows"], report["usable"], report["refused_count"]) == (args.rows, args.rows, 0), report
    assert (dup["exact"], dup["near"]) == (planted["exact"], planted["near"]), (dup, planted)
    measured = {"rows": lengths["rows"], "cut_rows": lengths["cut_rows"], "cut_tokens": lengths["cut_tokens"]}
    assert measured == counted and sum(lengths["histogram"]["counts"]) == args.rows, (measured, counted)
    held, exact, near = expected_overlap(generated, spec.random_seed)
    assert (overlap["eval_rows"], overlap["exact"], overlap["near"]) == (held, exact, near), (overlap, exact, near)
    read, made, tokenise = statistics.median(base_s), statistics.median(report_s), statistics.median(tokenise_s)
    print(f"found exactly the {dup['exact']} exact and {dup['near']} near duplicates planted; lengths "
          f"{lengths['min']}–{lengths['max']} tokens, keep_99 {lengths['keep_99']}, max_seq_length {MAX_SEQ_LENGTH} "
          f"cuts {lengths['cut_rows']} rows ({lengths['cut_tokens']} tokens), as counted row by row; eval overlap of "
          f"the {held} held-out rows: {overlap['exact']} exact, {overlap['near']} near, as the generator's record "
          "says")
    print(f"median: read {read:.2f} s, read and tokenise as TRL {tokenise:.2f} s, report {made:.2f} s; "
          f"report / read {made / read:.2f}, report / tokenise {made / tokenise:.2f}")
    print(json.dumps({"bench": "dataset_report", "rows": args.rows, "read_s": round(read, 2),
                      "tokenise_s": round(tokenise, 2), "report_s": round(made, 2),
                      "report_compute_s": round(statistics.median(compute_s), 2), "ratio": round(made / read, 2),
                      "ratio_to_tokenise": round(made / tokenise, 2), "exact": dup["exact"], "near": dup["near"],
                      "cut_rows": lengths["cut_rows"], "overlap": [overlap["exact"], overlap["near"]],
                      "planted": planted}))


if __name__ == "__main__":
    main()
