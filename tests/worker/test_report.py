"""The dataset report (worker/data/report.py), in-process, on a dataset with planted faults (local files, a split
named among them, a hub dataset in the local cache); and dedupe as a job applies it (worker/data prepare, and a
real training run)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tunestudio.config import JobConfig, ReportSpec
from tunestudio.worker import data, hub
from tunestudio.worker.data.report import build

from ..helpers.hub_cache import hub_planted
from ..helpers.jobs import DATA, job_config, run_job
from ..helpers.planted import MAX_SEQ_LENGTH, Planted, write_planted


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model))


@pytest.fixture
def planted(tmp_path: Path) -> Planted:
    return write_planted(tmp_path)


def config(*files: Path, **overrides: Any) -> ReportSpec:
    """What the report is asked (the CLI's and the API's ReportSpec)."""
    return ReportSpec.model_validate({"local_datasets": [str(f) for f in files], "max_seq_length": MAX_SEQ_LENGTH,
                                      **overrides})


def job(model: Path, *files: Path, **overrides: Any) -> JobConfig:
    """The job the report stands for, for `prepare`."""
    return JobConfig.model_validate({"model_name": str(model), "local_datasets": [str(f) for f in files],
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
        tokenizer: Any, tiny_model: Path) -> None:
    """The bundled dataset repeats its rows: every row a job holds out is also a training row, unless deduped."""
    overlap = build(config(DATA / "alpaca.jsonl", held_out=True), tokenizer)["eval_overlap"]
    prepared = data.prepare(job(tiny_model, DATA / "alpaca.jsonl", eval_steps=10), tokenizer)
    assert overlap["eval_rows"] == len(prepared.eval) == 20
    assert overlap["exact"] == 20 and len(overlap["rows"]) == 20
    raw = (DATA / "alpaca.jsonl").read_text().splitlines()
    held = [json.loads(raw[r["eval"]["line"] - 1]) for r in overlap["rows"]]
    for pair, row in zip(overlap["rows"], held, strict=True):
        assert json.loads(raw[pair["train"]["line"] - 1]) == row
    as_job = sorted((e["prompt"][0]["content"], e["completion"][0]["content"]) for e in prepared.eval)
    assert as_job == sorted((f"{r['instruction']}\n\n{r['input']}", r["output"]) for r in held)

    deduped = build(config(DATA / "alpaca.jsonl", held_out=True, dedupe="exact"), tokenizer)
    assert deduped["duplicates"]["removed"] == deduped["duplicates"]["exact"] == 329
    assert (deduped["eval_overlap"]["eval_rows"], deduped["eval_overlap"]["exact"]) == (16, 0)  # 5% of 71, ≥ 16


def test_an_empty_turn_is_counted_for_its_role(tmp_path: Path) -> None:
    """Turns training reads with no text (empty or blank content), per role; the rows stay usable."""
    turns = [
        [{"role": "system", "content": ""}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
        [{"role": "user", "content": "  \n"}, {"role": "assistant", "content": "fine"}],
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}],
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q2"},
         {"role": "assistant", "content": "a2"}, {"role": "user", "content": "q3"},
         {"role": "assistant", "content": "a3"}],
    ]
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps({"messages": t}) + "\n" for t in turns), encoding="utf-8")
    report = build(config(path))
    assert (report["format"], report["usable"], report["refused_count"]) == ("messages", 4, 0)
    assert report["roles"] == {"assistant": {"turns": 5, "empty": 1}, "system": {"turns": 2, "empty": 1},
                               "user": {"turns": 5, "empty": 1}}
    assert report["columns"] == {"messages": {"rows": 4, "empty": 0}}


def _named(overlap: dict[str, Any]) -> list[tuple[str, int, int]]:
    return [(r["kind"], r["eval"]["line"], r["train"]["line"]) for r in overlap["rows"]]


def test_an_eval_split_named_among_the_local_files_is_compared_with_the_training_rows(planted: Planted,
                                                                                      tmp_path: Path) -> None:
    """eval_split "test" is the folder's test.jsonl (a split name, not a path): its rows, not training rows."""
    folder = tmp_path / "splits"
    folder.mkdir()
    (folder / "train.jsonl").write_bytes(planted.train.read_bytes())
    (folder / "test.jsonl").write_bytes(planted.eval.read_bytes())
    report = build(config(folder, eval_split="test"))
    assert report["rows"] == planted.usable + len(planted.refused)  # test.jsonl is not read as training rows
    overlap = report["eval_overlap"]
    assert (overlap["source"], overlap["eval_rows"], overlap["exact"], overlap["near"]) == (
        "eval_split 'test'", 6, len(planted.eval_exact), len(planted.eval_near))
    assert _named(overlap) == ([("exact", e, t) for e, t in planted.eval_exact]
                               + [("near", e, t) for e, t in planted.eval_near])
    assert {r["eval"]["file"] for r in overlap["rows"]} == {str(folder / "test.jsonl")}
    assert {r["train"]["file"] for r in overlap["rows"]} == {str(folder / "train.jsonl")}


def test_a_hub_datasets_eval_split_is_compared_with_its_training_rows(planted: Planted, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """hf_dataset with eval_split "test", read as a job reads it (the cache alone: no hub): the planted leaked rows
    are named by split and position."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    hub.hub_reachable.cache_clear()
    hub_planted(planted, tmp_path / "cache")
    report = build(ReportSpec(hf_dataset="someorg/planted", eval_split="test", max_seq_length=MAX_SEQ_LENGTH))
    hub.hub_reachable.cache_clear()
    assert report["description"] == "someorg/planted (split train)"
    assert report["rows"] == planted.usable + len(planted.refused) - 1  # the malformed line is not in it
    overlap = report["eval_overlap"]
    assert (overlap["source"], overlap["eval_rows"], overlap["exact"], overlap["near"]) == (
        "eval_split 'test'", 6, len(planted.eval_exact), len(planted.eval_near))
    assert _named(overlap) == ([("exact", e, t) for e, t in planted.eval_exact]
                               + [("near", e, t) for e, t in planted.eval_near])
    assert {(r["eval"]["file"], r["train"]["file"]) for r in overlap["rows"]} == {
        ("someorg/planted[test]", "someorg/planted[train]")}


@pytest.mark.parametrize("mode", ["exact", "near"])
def test_prepare_with_dedupe_removes_exactly_the_planted_duplicates(mode: str, planted: Planted,
                                                                    tokenizer: Any, tiny_model: Path) -> None:
    prepared = data.prepare(job(tiny_model, planted.train, dedupe=mode), tokenizer)
    removed = len(planted.exact) + (len(planted.near) if mode == "near" else 0)
    assert prepared.deduplicated == removed and len(prepared.train) == planted.usable - removed
    assert f"dedupe {mode}: removed {removed} of {planted.usable} rows" in " ".join(prepared.notes)
    contents = [json.dumps(e, sort_keys=True) for e in prepared.train]
    assert len(set(contents)) == len(contents)  # no two rows alike, and one of each kept
    off = data.prepare(job(tiny_model, planted.train), tokenizer)
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


def test_the_report_finds_rows_that_differ_only_in_punctuation_case_or_spacing(tmp_path: Path) -> None:
    """Issue 38 finding 6: five rows that repeat others but for punctuation, case and spacing are near duplicates,
    named with the rows they repeat; rows sharing only some words are not merged."""
    rows = [{"instruction": f"Describe the cedar number {i} and its {kind}", "output": f"It grows {i} metres in "
             f"{kind} soil near the {place} river"}
            for i, (kind, place) in enumerate(zip(["bark", "roots", "leaves", "cones", "wood", "seeds"],
                                                  ["Oak", "Elm", "Ash", "Yew", "Fir", "Bay"], strict=True))]
    changed = [{"instruction": r["instruction"].upper(), "output": r["output"] + "."} for r in rows[:2]] + [
        {"instruction": r["instruction"].replace(" ", " ,  ") + "?", "output": r["output"].replace(" ", "\t")}
        for r in rows[2:4]]
    changed.append({"instruction": "describe: the cedar-number 4, and its WOOD!", "output": rows[4]["output"]})
    path = tmp_path / "cedar.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows + changed), encoding="utf-8")
    dup = build(config(path))["duplicates"]
    assert (dup["exact"], dup["near"]) == (0, 5)
    assert sorted((ex["rows"][0]["line"], ex["rows"][1]["line"]) for ex in dup["examples"]) == [
        (1, 7), (2, 8), (3, 9), (4, 10), (5, 11)]
    assert "casefolded" in dup["method"]


def test_the_report_counts_tools_calls_bad_calls_and_reasoning(tiny_model: Path, tmp_path: Path) -> None:
    # issue 41, point 5: tools per row, calls per conversation, rows calling undeclared functions or with
    # arguments that are not JSON, and the reasoning's share of the tokens
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    tok.chat_template = (Path(__file__).parent / "templates" / "qwen2_5.jinja").read_text()
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    other = {"type": "function", "function": {"name": "convert"}}

    def row(arguments: str, tools: list[dict[str, Any]], calls: int = 1) -> dict[str, Any]:
        made = [{"id": f"c{k}", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
                for k in range(calls)]
        return {"tools": tools, "messages": [
            {"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "", "tool_calls": made},
            *[{"role": "tool", "tool_call_id": f"c{k}", "content": "rain"} for k in range(calls)],
            {"role": "assistant", "content": "Rain.", "reasoning_content": "It said rain, so rain it is."}]}

    rows = [row('{"city": "Paris"}', [weather, other], calls=2), row('{"city": "Rome"}', [weather]),
            row('{"city": Rome}', [weather]), row('{"city": "Oslo"}', [other])]
    path = tmp_path / "tools.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = build(config(path, max_seq_length=4096), tok)
    tools = report["tools"]
    assert tools["tools_per_row"] == {"rows": 2, "mean": 1.5, "max": 2}
    assert tools["calls_per_conversation"] == {"rows": 2, "mean": 1.5, "max": 2}
    assert (tools["undeclared_call_rows"], tools["arguments_not_json_rows"]) == (1, 1)
    assert lines(report["refused"]) == [3, 4] and tools["reasoning_turns"] == 2
    assert 0 < tools["reasoning_share"] < 0.1 and tools["reasoning_tokens"] == 2 * len(
        tok("It said rain, so rain it is.", add_special_tokens=False)["input_ids"])
