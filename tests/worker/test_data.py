"""Reading, detecting, converting, slicing and splitting datasets (worker.data), in-process."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from tunestudio.config import JobConfig
from tunestudio.worker import data, hub
from tunestudio.worker.errors import UserError
from tunestudio.worker.tiny import make_rows

from ..helpers.jobs import DATA

ROWS = make_rows(40, seed=5)


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model))


def cfg_for(*paths: Path | str, **overrides: Any) -> JobConfig:
    base: dict[str, Any] = {"model_name": "unused", "output_dir": "/tmp/unused", "max_seq_length": 128}
    if paths:
        base["local_datasets"] = [str(p) for p in paths]
    base.update(overrides)
    return JobConfig.model_validate(base)


def write_jsonl(path: Path, items: list[Any]) -> Path:
    path.write_text("".join(json.dumps(i) + "\n" for i in items), encoding="utf-8")
    return path


# --- formats ----------------------------------------------------------------------
FORMATS = {
    "alpaca.jsonl": ("alpaca", ["prompt", "completion"]),
    # conversations reach the trainer tokenised, with their per-turn mask (worker/data/chat_mask.py)
    "sharegpt.json": ("sharegpt", ["input_ids", "assistant_masks"]),
    "messages.jsonl": ("messages", ["input_ids", "assistant_masks"]),
    "prompt_completion.jsonl": ("prompt_completion", ["prompt", "completion"]),
    "text.jsonl": ("text", ["text"]),
}


@pytest.mark.parametrize("name", list(FORMATS))
@pytest.mark.parametrize("how", ["auto", "named"])
def test_every_format_is_read_auto_detected_or_named(name: str, how: str, tokenizer: Any) -> None:
    fmt, columns = FORMATS[name]
    prepared = data.prepare(cfg_for(DATA / name, format_type=fmt if how == "named" else "auto"), tokenizer)
    assert prepared.format_type == fmt
    assert prepared.train.column_names == columns and len(prepared.train) == 400
    assert prepared.notes[0].endswith(f"read as {fmt}" + (" (auto-detected)" if how == "auto" else ""))
    assert prepared.warnings == [] and prepared.dropped == 0


def test_sharegpt_accepts_user_assistant_roles_and_alpaca_system(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "chat.jsonl", [
        {"conversations": [{"from": "system", "value": "Be brief."}, {"from": "user", "value": "Hi"},
                           {"from": "assistant", "value": "Hello"}]}])
    assert data.prepare(cfg_for(path)).train[0]["messages"] == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"}]
    alpaca = write_jsonl(tmp_path / "a.jsonl", [{"system": "S", "instruction": "I", "input": "X", "output": "O"}])
    row = data.prepare(cfg_for(alpaca)).train[0]
    assert row["prompt"] == [{"role": "system", "content": "S"}, {"role": "user", "content": "I\n\nX"}]
    assert row["completion"] == [{"role": "assistant", "content": "O"}]


def test_custom_format_mapping_maps_columns_to_roles(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "qa.jsonl", [{"question": "2+2?", "answer": "4", "extra": 1}])
    prepared = data.prepare(cfg_for(path, custom_format_mapping={"question": "user", "answer": "assistant"}))
    assert prepared.format_type == "custom"
    assert prepared.train[0] == {"prompt": [{"role": "user", "content": "2+2?"}],
                                 "completion": [{"role": "assistant", "content": "4"}]}


@pytest.mark.parametrize(("columns", "words"), [
    ({"question": "q", "answer": "a"}, ["not a format", "'answer', 'question'"]),
    ({"messages": [], "conversations": [], "x": 1}, ["ambiguous", "sharegpt and messages"]),
])
def test_unknown_or_ambiguous_format_lists_columns_and_says_how_to_set_it(
        tmp_path: Path, columns: dict, words: list[str]) -> None:
    path = write_jsonl(tmp_path / "odd.jsonl", [columns])
    with pytest.raises(UserError) as err:
        data.prepare(cfg_for(path))
    message = str(err.value)
    assert str(path) in message and "format_type" in message and "custom_format_mapping" in message
    for word in words:
        assert word in message


# --- sources ----------------------------------------------------------------------
def _write_source(kind: str, root: Path) -> list[Path]:
    if kind == "json list":
        (root / "d.json").write_text(json.dumps(ROWS))
        return [root / "d.json"]
    if kind == "json object of rows":
        (root / "d.json").write_text(json.dumps({"data": ROWS}))
        return [root / "d.json"]
    if kind == "json object of columns":
        (root / "d.json").write_text(json.dumps({k: [r[k] for r in ROWS] for k in ROWS[0]}))
        return [root / "d.json"]
    if kind == "jsonl":
        return [write_jsonl(root / "d.jsonl", ROWS)]
    if kind == "csv":
        with (root / "d.csv").open("w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(ROWS[0]))
            writer.writeheader()
            writer.writerows(ROWS)
        return [root / "d.csv"]
    if kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(ROWS), root / "d.parquet")
        return [root / "d.parquet"]
    if kind == "folder":
        folder = root / "folder"
        folder.mkdir()
        write_jsonl(folder / "a.jsonl", ROWS[:25])
        (folder / "b.json").write_text(json.dumps(ROWS[25:]))
        (folder / "notes.txt").write_text("not data")
        return [folder]
    assert kind == "several files"
    return [write_jsonl(root / "a.jsonl", ROWS[:10]), write_jsonl(root / "b.jsonl", ROWS[10:])]


@pytest.mark.parametrize("kind", ["json list", "json object of rows", "json object of columns", "jsonl", "csv",
                                  "parquet", "folder", "several files"])
def test_every_local_source_reads_the_same_rows(kind: str, tmp_path: Path) -> None:
    expected = data.prepare(cfg_for(write_jsonl(tmp_path / "ref.jsonl", ROWS))).train.to_list()
    source = tmp_path / "src"
    source.mkdir()
    prepared = data.prepare(cfg_for(*_write_source(kind, source)))
    assert prepared.format_type == "alpaca"
    assert prepared.train.to_list() == expected


def _datasets_dict(rows: list[dict], n_test: int) -> Any:
    from datasets import Dataset, DatasetDict

    return DatasetDict({"train": Dataset.from_list(rows[n_test:]), "test": Dataset.from_list(rows[:n_test])})


def test_dataset_saved_by_datasets_with_its_splits(tmp_path: Path) -> None:
    _datasets_dict(ROWS, 8).save_to_disk(str(tmp_path / "saved"))
    prepared = data.prepare(cfg_for(hf_dataset=str(tmp_path / "saved"), eval_split="test", eval_steps=2))
    assert len(prepared.train) == 32 and prepared.eval is not None and len(prepared.eval) == 8
    assert "eval: 8 rows from eval_split 'test'" in prepared.notes
    with pytest.raises(UserError, match=r"has no split 'validation'; it has \['test', 'train'\]"):
        data.prepare(cfg_for(hf_dataset=str(tmp_path / "saved"), eval_split="validation", eval_steps=2))


def test_hub_dataset_id_loads_from_the_cache_with_subset_and_split(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets
    from datasets.packaged_modules.json.json import Json

    # Fill the cache the way `load_dataset` leaves it after a download, with `datasets`' own builder.
    cache = tmp_path / "cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    write_jsonl(tmp_path / "train.jsonl", ROWS[8:])
    write_jsonl(tmp_path / "test.jsonl", ROWS[:8])
    builder = Json(cache_dir=str(cache), data_files={"train": str(tmp_path / "train.jsonl"),
                                                     "test": str(tmp_path / "test.jsonl")},
                   dataset_name="someorg___tiny-tasks", config_name="tasks", config_id="tasks", hash="0")
    builder.download_and_prepare()
    for path in Path(builder.cache_dir).glob("someorg___*.arrow"):
        path.rename(path.with_name(path.name.removeprefix("someorg___")))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # and no hub: the cache alone must do
    hub.hub_reachable.cache_clear()

    prepared = data.prepare(cfg_for(hf_dataset="someorg/tiny-tasks", subset="tasks", eval_split="test",
                                    eval_steps=0.5))
    assert (len(prepared.train), len(prepared.eval or [])) == (32, 8)
    assert prepared.notes[0].startswith("dataset: 32 rows from someorg/tiny-tasks (split train, subset tasks)")


def test_hub_dataset_not_cached_and_hub_unreachable_fails_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    hub.hub_reachable.cache_clear()
    with pytest.raises(UserError) as err:
        data.prepare(cfg_for(hf_dataset="someorg/not-cached"))
    assert "dataset 'someorg/not-cached'" in str(err.value) and "unreachable" in str(err.value)
    hub.hub_reachable.cache_clear()


# --- slicing ----------------------------------------------------------------------
@pytest.mark.parametrize(("start", "end", "expected"), [
    (None, None, list(range(10))),
    (3, 5, [3, 4, 5]),  # both ends inclusive
    (0, 0, [0]),
    (9, None, [9]),
    (None, 9, list(range(10))),
    (7, 500, [7, 8, 9]),  # the end clamps to the last row
])
def test_slice_is_inclusive_and_clamped(start: int | None, end: int | None, expected: list[int]) -> None:
    assert data.slice_rows(list(range(10)), start, end) == expected


def test_a_slice_past_the_end_is_an_error_naming_the_slice_and_the_row_count(tmp_path: Path) -> None:
    for start, end, shown in ((10, None, "10..end"), (500, 900, "500..900")):
        with pytest.raises(UserError, match=f"slice {shown} starts past the end of the dataset, which has 10 rows"):
            data.slice_rows(list(range(10)), start, end)
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    with pytest.raises(UserError) as err:
        data.prepare(cfg_for(path, dataset_slice_start=40))
    assert "slice 40..end starts past the end of dataset 1 file(s): d.jsonl, which has 40 rows" in str(err.value)


def test_slice_applies_to_the_rows_read(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    prepared = data.prepare(cfg_for(path, dataset_slice_start=2, dataset_slice_end=4))
    assert [r["completion"][0]["content"] for r in prepared.train] == [r["output"] for r in ROWS[2:5]]
    assert "rows 2..4 kept of 40" in prepared.notes[1]


# --- eval splits --------------------------------------------------------------------
@pytest.mark.parametrize(("rows", "size"), [(31, 0), (32, 16), (320, 16), (400, 20), (2560, 128), (10_000, 128)])
def test_auto_eval_size_is_5_percent_clamped_to_16_to_128(rows: int, size: int) -> None:
    assert data.auto_eval_size(rows) == size


def test_auto_eval_holds_out_rows_when_eval_steps_is_set(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"instruction": f"Say {i}.", "output": str(i)} for i in range(400)])
    assert data.prepare(cfg_for(path)).eval is None  # eval_steps 0: no eval
    prepared = data.prepare(cfg_for(path, eval_steps=0.25))
    assert (len(prepared.train), len(prepared.eval or [])) == (380, 20)
    assert set(map(json.dumps, prepared.train.to_list())).isdisjoint(map(json.dumps, (prepared.eval or []).to_list()))
    again = data.prepare(cfg_for(path, eval_steps=0.25))
    assert again.eval is not None and again.eval.to_list() == prepared.eval.to_list()  # same seed, same split


def test_auto_eval_on_a_small_dataset_warns_and_skips(tmp_path: Path) -> None:
    prepared = data.prepare(cfg_for(write_jsonl(tmp_path / "d.jsonl", ROWS[:31]), eval_steps=5))
    assert prepared.eval is None and len(prepared.train) == 31
    assert any("fewer than 32" in w for w in prepared.warnings)


def test_local_eval_split_by_file_name_or_path(tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", ROWS[10:])
    write_jsonl(folder / "test.jsonl", ROWS[:10])
    by_name = data.prepare(cfg_for(folder, eval_split="test", eval_steps=2))
    assert (len(by_name.train), len(by_name.eval or [])) == (30, 10)
    # Without eval_split, a folder's train_split files are the training data, and test files stay out of it.
    assert len(data.prepare(cfg_for(folder)).train) == 30
    other = write_jsonl(tmp_path / "held.jsonl", ROWS[:5])
    by_path = data.prepare(cfg_for(folder / "train.jsonl", eval_split=str(other), eval_steps=2))
    assert (len(by_path.train), len(by_path.eval or [])) == (30, 5)
    with pytest.raises(UserError, match="eval_split 'validation': no file named validation"):
        data.prepare(cfg_for(folder, eval_split="validation", eval_steps=2))


def test_split_folders_hold_their_splits_as_an_image_folders_do(tmp_path: Path) -> None:
    """train/ and test/ folders with a file of one name each (an image folder's metadata.csv): the test rows never
    train, with eval_split or without it."""
    for split, rows in (("train", ROWS[10:]), ("test", ROWS[:10])):
        (tmp_path / "folder" / split).mkdir(parents=True)
        write_jsonl(tmp_path / "folder" / split / "metadata.jsonl", rows)
    by_folder = data.prepare(cfg_for(tmp_path / "folder", eval_split="test", eval_steps=2))
    assert (len(by_folder.train), len(by_folder.eval or [])) == (30, 10)
    assert len(data.prepare(cfg_for(tmp_path / "folder")).train) == 30


# --- bad data -----------------------------------------------------------------------
def _bad(tmp_path: Path, case: str) -> tuple[Path, str]:
    """A dataset for one bad-data case, and the text its failure must contain."""
    path = tmp_path / "bad.jsonl"
    good = [json.dumps(r) for r in ROWS[:6]]
    if case == "empty":
        path.write_text("\n\n")
        return path, f"dataset {path} is empty"
    if case == "missing fields":
        write_jsonl(path, [{"instruction": "x", "answer": "y"}] * 4 + ROWS[:6])  # 4 of 10: over 30%
        return path, f"dataset {path} row 1 has no 'output' field"
    if case == "not utf-8":
        path.write_bytes(("\n".join(good[:2]) + "\n").encode() + '{"instruction": "caf\xe9"}\n'.encode("latin-1"))
        return path, f"dataset {path} row 3 is not valid UTF-8"
    if case == "malformed json lines":
        path.write_text("\n".join([*good[:5], '{"instruction": "x",', *good[5:], "[1, 2", "{oops}"]) + "\n")
        return path, f"dataset {path} row 6 is not valid JSON"
    assert case == "prompt fills max_seq_length"
    write_jsonl(path, [{"instruction": "apple " * 200, "output": "short"}] * 10)
    return path, f"dataset {path} row 1 has a prompt of"


@pytest.mark.parametrize("case", ["empty", "missing fields", "not utf-8", "malformed json lines",
                                  "prompt fills max_seq_length"])
def test_bad_data_fails_naming_the_file_and_row(case: str, tmp_path: Path, tokenizer: Any) -> None:
    path, expected = _bad(tmp_path, case)
    with pytest.raises(UserError) as err:
        data.prepare(cfg_for(path, format_type="alpaca"), tokenizer)
    assert expected in str(err.value)


def test_a_few_bad_rows_are_dropped_and_counted(tmp_path: Path, tokenizer: Any) -> None:
    path = tmp_path / "d.jsonl"
    lines = [json.dumps(r) for r in ROWS[:10]]
    lines[2] = "{not json"
    lines[5] = json.dumps({"instruction": "apple " * 200, "output": "x"})
    lines[7] = json.dumps({"instruction": "no output"})
    path.write_text("\n".join(lines) + "\n")  # 3 of 10 bad: exactly 30%, still allowed
    prepared = data.prepare(cfg_for(path), tokenizer)
    assert len(prepared.train) == 7 and prepared.dropped == 3
    [warning] = prepared.warnings
    assert "dropped 3 of 10 rows (30%)" in warning
    for row in ("row 3 is not valid JSON", "row 6 has a prompt of", "row 8 has no 'output' field"):
        assert f"{path} {row}" in warning
    lines[8] = "[]"  # a fourth: 40%
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError, match=r"4 of 10 rows \(40%\) cannot be used, more than the 30% allowed"):
        data.prepare(cfg_for(path), tokenizer)


# --- chat templates -------------------------------------------------------------------
def test_model_without_a_template_gets_the_default_with_a_warning(tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    tok.chat_template = None
    prepared = data.prepare(cfg_for(DATA / "messages.jsonl", dataset_slice_end=3), tok)
    assert tok.chat_template == data.DEFAULT_CHAT_TEMPLATE
    assert any("no chat template" in w for w in prepared.warnings)
    text = tok.decode(prepared.train[0]["input_ids"])
    assert text.startswith("<|im_start|>user\n") and text.endswith(tok.eos_token)


def test_template_without_generation_markers_trains_every_assistant_turn(tiny_model: Path, tmp_path: Path) -> None:
    # Before issue 41 such a template trained only the last assistant turn (last_turn_as_completion).
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    tok.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    turns = [USER, {"role": "assistant", "content": "one"}, {"role": "user", "content": "again"},
             {"role": "assistant", "content": "two"}]
    prepared = data.prepare(cfg_for(write_jsonl(tmp_path / "r.jsonl", [{"messages": turns}]),
                                    train_on_completions=True), tok)
    row = prepared.train[0]
    trained = tok.decode([i for i, m in zip(row["input_ids"], row["assistant_masks"], strict=True) if m])
    # this template has no generation prompt: the model writes the role too, so that is trained
    assert trained == "assistant: one\nassistant: two\n" and not prepared.warnings


# --- the loss mask, through the worker's own trainer ------------------------------------
KNOWN = {"instruction": "Reverse the letters of the word.", "input": "stone", "output": "enots"}
USER = {"role": "user", "content": "Reverse the letters of the word.\n\nstone"}
ASSISTANT = {"role": "assistant", "content": "enots"}
KNOWN_ROWS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "alpaca": (KNOWN, {}),
    "messages": ({"messages": [USER, ASSISTANT]}, {}),
    "sharegpt": ({"conversations": [{"from": "human", "value": USER["content"]},
                                    {"from": "gpt", "value": ASSISTANT["content"]}]}, {}),
    "custom mapping": ({"q": USER["content"], "a": ASSISTANT["content"]},
                       {"custom_format_mapping": {"q": "user", "a": "assistant"}}),
    "messages, default template": ({"messages": [USER, ASSISTANT]}, {}),
}


def _trainer(tiny_model: Path, tmp_path: Path, rows: list[dict], tok: Any = None, **overrides: Any) -> Any:
    import torch

    from tunestudio.worker.train import model as model_mod
    from tunestudio.worker.train import train

    from ..helpers.channel import ListChannel

    cfg = cfg_for(write_jsonl(tmp_path / "rows.jsonl", rows), model_name=str(tiny_model), training_type="full",
                  output_dir=str(tmp_path / "out"), **overrides)
    tok = tok or model_mod.load_tokenizer(cfg)
    prepared = data.prepare(cfg, tok)
    channel = ListChannel()
    trainer, _ = train.build_trainer(cfg, model_mod.load_model(cfg, torch.float32), tok, prepared,
                                     train.resolve_precision(cfg), False, channel)
    return trainer, tok, channel


@pytest.mark.parametrize("case", list(KNOWN_ROWS))
def test_train_on_completions_masks_exactly_the_prompt(case: str, tiny_model: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    row, overrides = KNOWN_ROWS[case]
    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    if case.endswith("default template"):
        tok.chat_template = None
    trainer, tok, _ = _trainer(tiny_model, tmp_path, [row, row], tok, train_on_completions=True, **overrides)
    prompt = tok.apply_chat_template([USER], add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    full = tok.apply_chat_template([USER, ASSISTANT], tokenize=True, return_dict=True)["input_ids"]
    assert full[: len(prompt)] == prompt and len(full) > len(prompt) + 1
    expected = [-100] * len(prompt) + full[len(prompt):]
    assert tok.decode(full[len(prompt):]).startswith("enots")  # the reply and its end-of-turn token

    example = trainer.train_dataset[0]
    assert example["input_ids"] == full
    assert example["labels"] == expected
    batch = trainer.data_collator([trainer.train_dataset[0], trainer.train_dataset[1]])
    assert batch["labels"][0].tolist() == expected  # the collator keeps the mask


def test_train_on_completions_masks_plain_prompt_completion(tiny_model: Path, tmp_path: Path) -> None:
    row = {"prompt": "Reverse the letters of the word.\n\nstone\n", "completion": "enots"}
    trainer, tok, _ = _trainer(tiny_model, tmp_path, [row], train_on_completions=True)
    prompt = tok(row["prompt"])["input_ids"]
    example = trainer.train_dataset[0]
    assert example["input_ids"][: len(prompt)] == prompt
    assert example["labels"] == [-100] * len(prompt) + example["input_ids"][len(prompt):]
    assert tok.decode(example["input_ids"][len(prompt):]) == "enots" + tok.eos_token


def test_train_on_completions_on_text_trains_every_token_and_says_so(tiny_model: Path, tmp_path: Path) -> None:
    # TRL's completion_only_loss silently does nothing on text rows: the worker must warn instead.
    trainer, _, channel = _trainer(tiny_model, tmp_path, [{"text": "apple river"}], train_on_completions=True)
    example = trainer.train_dataset[0]
    assert example["labels"] == example["input_ids"]
    assert any("no effect on plain text" in w for w in channel.warnings())


def test_without_train_on_completions_every_token_is_trained(tiny_model: Path, tmp_path: Path) -> None:
    trainer, _, _ = _trainer(tiny_model, tmp_path, [KNOWN], train_on_completions=False)
    example = trainer.train_dataset[0]
    assert example["labels"] == example["input_ids"]


def test_packed_sequences_stay_isolated(tiny_model: Path, tmp_path: Path) -> None:
    import torch

    rows = make_rows(24, seed=3)
    trainer, _, _ = _trainer(tiny_model, tmp_path, rows, packing=True, max_seq_length=96, train_on_completions=True)
    packed = next(r for r in trainer.train_dataset if len(r["seq_lengths"]) >= 3)
    batch = trainer.data_collator([packed])
    lengths = packed["seq_lengths"]
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    positions = batch["position_ids"][0].tolist()
    assert [i for i, p in enumerate(positions[: sum(lengths)]) if p == 0] == starts
    assert all(batch["labels"][0, s].item() == -100 for s in starts)  # no loss across a boundary

    # In float64: the packed and the separate forward passes sum in different orders (kernel choice, thread
    # count), which in float32 differed by up to 5e-4 in a full run; in float64 that noise is ~1e-12, far
    # below any leak between sequences.
    model = trainer.model.eval().double()
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        together = model(**inputs).logits[0]
        joined = model(input_ids=batch["input_ids"]).logits[0]  # one causal sequence: would leak
        worst = 0.0
        for start, length in zip(starts, lengths, strict=True):
            alone = model(input_ids=batch["input_ids"][:, start : start + length]).logits[0]
            worst = max(worst, (together[start : start + length] - alone).abs().max().item())
        last = starts[-1]
        leak = (joined[last : last + lengths[-1]] - alone).abs().max().item()  # what the check must catch
    assert together.dtype == torch.float64
    assert worst < 1e-6, worst
    assert leak > 1e-3 and worst < 1e-4 * leak, (worst, leak)  # the check can fail, by orders of magnitude
