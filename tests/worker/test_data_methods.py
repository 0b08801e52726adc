"""The datasets of DPO, ORPO, KTO, GRPO and pretrain (worker/data/method_formats.py), in-process."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from tunestudio.config import JobConfig
from tunestudio.worker import data
from tunestudio.worker.errors import UserError

from ..helpers.jobs import DATA


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model))


def cfg_for(*paths: Path | str, **overrides: Any) -> JobConfig:
    base: dict[str, Any] = {"model_name": "unused", "output_dir": "/tmp/unused", "max_seq_length": 128,
                            "local_datasets": [str(p) for p in paths]}
    if overrides.get("method") == "grpo":
        base["reward_functions"] = ["exact_match"]
    base.update(overrides)
    return JobConfig.model_validate(base)


def write_jsonl(path: Path, items: list[Any]) -> Path:
    path.write_text("".join(json.dumps(i) + "\n" for i in items), encoding="utf-8")
    return path


# The bundled files (tunestudio make-dataset) in each method's format, and the columns training sees.
BUNDLED = {
    ("dpo", "preference.jsonl"): ("preference", ["prompt", "chosen", "rejected"]),
    ("orpo", "preference.jsonl"): ("preference", ["prompt", "chosen", "rejected"]),
    ("kto", "unpaired.jsonl"): ("unpaired", ["prompt", "completion", "label"]),
    ("kto", "preference.jsonl"): ("preference", ["prompt", "chosen", "rejected"]),
    ("grpo", "prompts.jsonl"): ("prompt_only", ["answer", "task", "prompt"]),
    ("pretrain", "text.jsonl"): ("text", ["text"]),
}


@pytest.mark.parametrize(("method", "name"), list(BUNDLED))
@pytest.mark.parametrize("how", ["auto", "named"])
def test_each_method_format_is_read_auto_detected_or_named(method: str, name: str, how: str, tokenizer: Any) -> None:
    fmt, columns = BUNDLED[(method, name)]
    cfg = cfg_for(DATA / name, method=method, format_type=fmt if how == "named" else "auto")
    prepared = data.prepare(cfg, tokenizer)
    assert prepared.format_type == fmt
    assert prepared.train.column_names == columns and len(prepared.train) == 400
    # The log line says what was picked.
    assert prepared.notes[0].endswith(f"read as {fmt}" + (" (auto-detected)" if how == "auto" else ""))
    assert prepared.dropped == 0


def test_preference_strings_stay_strings_and_a_conversation_makes_every_row_one(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [
        {"prompt": "2 + 2 =", "chosen": "4", "rejected": "5"},
        {"prompt": "3 + 3 =", "chosen": [{"role": "assistant", "content": "6"}], "rejected": "7"},
    ])
    rows = data.prepare(cfg_for(path, method="dpo")).train.to_list()
    # One dataset holds one shape: a conversation in any row makes every row's parts conversations.
    assert rows[0] == {"prompt": [{"role": "user", "content": "2 + 2 ="}],
                       "chosen": [{"role": "assistant", "content": "4"}],
                       "rejected": [{"role": "assistant", "content": "5"}]}
    assert rows[1]["rejected"] == [{"role": "assistant", "content": "7"}]
    strings = write_jsonl(tmp_path / "s.jsonl", [{"prompt": "2 + 2 =", "chosen": "4", "rejected": "5"}])
    assert data.prepare(cfg_for(strings, method="dpo")).train.to_list() == [
        {"prompt": "2 + 2 =", "chosen": "4", "rejected": "5"}]


def test_preference_without_a_prompt_takes_the_shared_opening_turns(tmp_path: Path) -> None:
    user = {"role": "user", "content": "Say hi"}
    path = write_jsonl(tmp_path / "p.jsonl", [{
        "chosen": [user, {"role": "assistant", "content": "hi"}],
        "rejected": [user, {"role": "assistant", "content": "no"}],
    }])
    row = data.prepare(cfg_for(path, method="orpo")).train.to_list()[0]
    assert row == {"prompt": [user], "chosen": [{"role": "assistant", "content": "hi"}],
                   "rejected": [{"role": "assistant", "content": "no"}]}


def test_unpaired_labels_read_from_csv_words(tmp_path: Path) -> None:
    path = tmp_path / "u.csv"
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["prompt", "completion", "label"])
        writer.writerows([["a", "b", "true"], ["c", "d", "no"], ["e", "f", "1"]])
    rows = data.prepare(cfg_for(path, method="kto")).train.to_list()
    assert [r["label"] for r in rows] == [True, False, True]


def test_grpo_keeps_every_other_column_for_the_reward_functions(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "g.jsonl", [{"prompt": "1 + 1 =", "answer": "2", "level": 1, "tags": ["math"]}])
    row = data.prepare(cfg_for(path, method="grpo")).train.to_list()[0]
    assert row == {"prompt": "1 + 1 =", "answer": "2", "level": 1, "tags": ["math"]}


@pytest.mark.parametrize(("method", "mapping", "row", "expected"), [
    ("dpo", {"q": "prompt", "good": "chosen", "bad": "rejected"}, {"q": "x", "good": "y", "bad": "z"},
     {"prompt": "x", "chosen": "y", "rejected": "z"}),
    ("kto", {"q": "prompt", "reply": "completion", "ok": "label"}, {"q": "x", "reply": "y", "ok": False},
     {"prompt": "x", "completion": "y", "label": False}),
    ("grpo", {"question": "prompt", "solution": "answer"}, {"question": "x", "solution": "4", "id": 9},
     {"prompt": "x", "answer": "4", "id": 9}),
    ("pretrain", {"body": "text"}, {"body": "some text", "id": 1}, {"text": "some text"}),
])
def test_custom_format_mapping_names_each_methods_columns(
    method: str, mapping: dict[str, str], row: dict[str, Any], expected: dict[str, Any], tmp_path: Path
) -> None:
    path = write_jsonl(tmp_path / "m.jsonl", [row])
    prepared = data.prepare(cfg_for(path, method=method, custom_format_mapping=mapping))
    assert prepared.train.to_list() == [expected]
    assert prepared.notes[0].endswith(f"read as {prepared.format_type}")  # chosen by the mapping, not detected


def test_auto_detection_for_a_method_names_the_columns_it_needs(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "alpaca.jsonl", [{"instruction": "a", "output": "b"}])
    with pytest.raises(UserError) as info:
        data.prepare(cfg_for(path, method="dpo"))
    message = str(info.value)
    assert str(path) in message and "method 'dpo'" in message and "chosen, rejected" in message
    assert "['instruction', 'output']" in message and "custom_format_mapping" in message


@pytest.mark.parametrize(("method", "rows", "row_number", "says"), [
    ("dpo", [{"prompt": "p", "chosen": "c", "rejected": "r"}, {"prompt": "p", "chosen": "c"}], 2,
     "has no 'rejected' field"),
    ("kto", [{"prompt": "p", "completion": "c", "label": True}, {"prompt": "p", "completion": "c",
                                                                  "label": "maybe"}], 2,
     "field 'label' is 'maybe', not true or false"),
    ("grpo", [{"prompt": "p", "answer": "a"}, {"prompt": "p", "other": 1}], 2,
     "has no 'answer' field, which reward function exact_match compares with"),
    ("orpo", [{"prompt": "p", "chosen": [{"role": "bot?", "content": "c"}], "rejected": "r"}], 1,
     "turn 1 of 'chosen' needs role/content text"),
])
def test_a_row_missing_a_needed_field_is_named_by_file_and_row(
    method: str, rows: list[dict[str, Any]], row_number: int, says: str, tmp_path: Path
) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    # One bad row in two is more than the 30% a job may drop: the job fails and names it.
    with pytest.raises(UserError) as info:
        data.prepare(cfg_for(path, method=method))
    assert f"dataset {path} row {row_number} {says}" in str(info.value)


def test_numeric_match_needs_numeric_answers(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "g.jsonl", [{"prompt": "p", "answer": "seven"}])
    with pytest.raises(UserError, match=r"row 1 field 'answer' is 'seven', not a number"):
        data.prepare(cfg_for(path, method="grpo", reward_functions=["numeric_match"]))
