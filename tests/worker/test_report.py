"""The dataset report (worker/data/report.py), in-process, on a dataset with planted faults; and dedupe as a job
applies it (worker/data prepare, and a real training run)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tunestudio.config import JobConfig
from tunestudio.worker import data
from tunestudio.worker.data.report import build

from ..helpers.jobs import DATA, job_config, run_job
from ..helpers.planted import MAX_SEQ_LENGTH, Planted, write_planted


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model))


@pytest.fixture
def planted(tmp_path: Path) -> Planted:
    return write_planted(tmp_path)


def config(*files: Path, **overrides: Any) -> JobConfig:
    return JobConfig.model_validate({"model_name": "unused", "local_datasets": [str(f) for f in files],
                                     "max_seq_length": MAX_SEQ_LENGTH, **overrides})


def lines(items: list[dict[str, Any]]) -> list[int]:
    return [item["line"] for item in items]


def test_the_report_finds_each_planted_fault_and_names_its_rows(planted: Planted, tokenizer: Any) -> None:
    report = build(config(planted.train, eval_split=str(planted.eval)), tokenizer)
    assert (report["rows"], report["usable"], report["format"], report["detected"]) == (
        planted.usable + len(planted.refused), planted.usable, "alpaca", True)

    assert report["refused_count"] == len(planted.refused)
    assert lines(report["refused"]) == sorted(planted.refused)
    for item in report["refused"]:
        assert item["file"] == str(planted.train) and planted.refused[item["line"]] in item["reason"]

    dup = report["duplicates"]
    assert (dup["exact"], dup["near"], dup["threshold"], dup["removed"]) == (
        len(planted.exact), len(planted.near), 0.8, 0)
    exact_groups = {ex["rows"][0]["line"]: lines(ex["rows"][1:]) for ex in dup["examples"] if ex["kind"] == "exact"}
    assert exact_groups == {3: [41], 6: [42, 43]}  # each copy named with the first row it repeats
    assert sorted((ex["rows"][1]["line"], ex["rows"][0]["line"]) for ex in dup["examples"]
                  if ex["kind"] == "near") == planted.near
    assert all(0.8 <= ex["similarity"] < 1 for ex in dup["examples"] if ex["kind"] == "near")

    overlap = report["eval_overlap"]
    assert (overlap["eval_rows"], overlap["exact"], overlap["near"]) == (6, len(planted.eval_exact),
                                                                         len(planted.eval_near))
    named = [(r["kind"], r["eval"]["line"], r["train"]["line"]) for r in overlap["rows"]]
    assert named == [("exact", e, t) for e, t in planted.eval_exact] + [("near", e, t) for e, t in planted.eval_near]
    assert all(r["eval"]["file"] == str(planted.eval) and r["train"]["file"] == str(planted.train)
               for r in overlap["rows"])

    # the malformed line has no columns; the row without an output lacks that one; every input is ""
    read = planted.usable + len(planted.refused) - 1
    assert report["columns"] == {"input": {"rows": read, "empty": read}, "instruction": {"rows": read, "empty": 0},
                                 "output": {"rows": read - 1, "empty": 0}}
    assert report["roles"] == {"assistant": {"turns": planted.usable, "empty": 0},
                               "user": {"turns": planted.usable, "empty": 0}}
    json.dumps(report)  # the answer is JSON as it stands


def test_token_lengths_are_what_the_trainer_tokenises(planted: Planted, tokenizer: Any) -> None:
    """Each usable row as TRL tokenises a conversational prompt/completion: the chat template over both."""
    expected = []
    for line in planted.train.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "output" not in row or len(row["instruction"].split()) > 100:
            continue  # refused
        conversation = [{"role": "user", "content": row["instruction"]},
                        {"role": "assistant", "content": row["output"]}]
        expected.append(len(tokenizer.apply_chat_template(conversation, tokenize=True, return_dict=True)["input_ids"]))
    assert len(expected) == planted.usable
    over = [n - MAX_SEQ_LENGTH for n in expected if n > MAX_SEQ_LENGTH]
    assert len(over) == len(planted.long)  # only the planted long rows are over

    lengths = build(config(planted.train), tokenizer)["lengths"]
    ordered = sorted(expected)
    assert (lengths["unit"], lengths["rows"], lengths["min"], lengths["max"]) == (
        "tokens", planted.usable, ordered[0], ordered[-1])
    assert (lengths["cut_rows"], lengths["cut_tokens"]) == (len(over), sum(over))
    assert lengths["keep_95"] == ordered[44] and lengths["keep_99"] == ordered[46]  # nearest rank of 47 rows
    assert lengths["keep_95"] < MAX_SEQ_LENGTH < lengths["keep_99"]
    edges, counts = lengths["histogram"]["edges"], lengths["histogram"]["counts"]
    assert sum(counts) == planted.usable and len(edges) == len(counts) + 1 and edges[0] == ordered[0]
    assert edges[-1] > ordered[-1] and lengths["clipped_rows"] == 0


def test_without_a_tokenizer_there_are_no_lengths_and_a_note_says_why(planted: Planted) -> None:
    report = build(config(planted.train), None)
    assert report["lengths"] is None and any("--model" in n for n in report["notes"])
    assert report["refused_count"] == len(planted.refused) - 1  # the prompt that fills max_seq_length needs tokens


def test_the_held_out_rows_are_the_jobs_and_dedupe_exact_leaves_none_repeating_a_training_row(
        tokenizer: Any) -> None:
    """The bundled dataset repeats its rows: every row a job holds out is also a training row, unless deduped."""
    cfg = config(DATA / "alpaca.jsonl", eval_steps=10)
    overlap = build(cfg, tokenizer)["eval_overlap"]
    prepared = data.prepare(cfg, tokenizer)
    assert overlap["eval_rows"] == len(prepared.eval) == 20
    assert overlap["exact"] == 20 and len(overlap["rows"]) == 20
    raw = (DATA / "alpaca.jsonl").read_text().splitlines()
    held = [json.loads(raw[r["eval"]["line"] - 1]) for r in overlap["rows"]]
    for pair, row in zip(overlap["rows"], held, strict=True):
        assert json.loads(raw[pair["train"]["line"] - 1]) == row
    as_job = sorted((e["prompt"][0]["content"], e["completion"][0]["content"]) for e in prepared.eval)
    assert as_job == sorted((f"{r['instruction']}\n\n{r['input']}", r["output"]) for r in held)

    deduped = build(config(DATA / "alpaca.jsonl", eval_steps=10), tokenizer, dedupe="exact")
    assert deduped["duplicates"]["removed"] == deduped["duplicates"]["exact"] == 329
    assert (deduped["eval_overlap"]["eval_rows"], deduped["eval_overlap"]["exact"]) == (16, 0)  # 5% of 71, ≥ 16


@pytest.mark.parametrize("mode", ["exact", "near"])
def test_prepare_with_dedupe_removes_exactly_the_planted_duplicates(mode: str, planted: Planted,
                                                                    tokenizer: Any) -> None:
    prepared = data.prepare(config(planted.train, dedupe=mode), tokenizer)
    removed = len(planted.exact) + (len(planted.near) if mode == "near" else 0)
    assert prepared.deduplicated == removed and len(prepared.train) == planted.usable - removed
    assert f"dedupe {mode}: removed {removed} of {planted.usable} rows" in " ".join(prepared.notes)
    contents = [json.dumps(e, sort_keys=True) for e in prepared.train]
    assert len(set(contents)) == len(contents)  # no two rows alike, and one of each kept
    off = data.prepare(config(planted.train), tokenizer)
    assert off.deduplicated == 0 and len(off.train) == planted.usable


@pytest.mark.timeout(300)
def test_a_job_with_dedupe_exact_trains_without_the_planted_duplicates(planted: Planted, tiny_model: Path,
                                                                       tmp_path: Path) -> None:
    cfg = job_config(tiny_model, tmp_path / "out", local_datasets=[str(planted.train)], dedupe="exact",
                     max_seq_length=MAX_SEQ_LENGTH, max_steps=2, batch_size=4)
    run = run_job(cfg)
    assert run.completed.saved, run.failure
    assert run.completed.metrics["dedupe_removed"] == len(planted.exact)  # the job's summary (final_metrics)
    messages = run.messages()
    assert any(f"dedupe exact: removed {len(planted.exact)} of {planted.usable} rows" in m for m in messages)
    assert any(f"dropped {len(planted.refused)} of {planted.usable + len(planted.refused)} rows" in m
               for m in messages)
