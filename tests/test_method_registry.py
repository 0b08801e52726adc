"""Every fact about a training method is its MethodSpec's (config/methods.py), and the readers ask the entry:
the estimate's rows per example and fused head, the OpenAI fine-tuning API's method type and the file it trains
from (issue 39, point 6). Each test changes one entry and watches its reader follow."""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path
from typing import get_args

import pytest

from tunestudio.api.errors import ApiError
from tunestudio.api.estimate_time import Facts
from tunestudio.api.fine_tuning import config_fields, method_of
from tunestudio.api.fine_tuning_schemas import CreateJob, Hyperparameters, MethodIn
from tunestudio.config import METHOD_SPECS, OPENAI_TYPES, JobConfig, MethodSpec, openai_method
from tunestudio.estimate import memory

# A small Llama shape: the arithmetic only reads these numbers.
SHAPE = {"model_type": "llama", "vocab_size": 32_000, "hidden_size": 256, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 688}


def activations(method: str, batch_size: int) -> int:
    return memory(SHAPE, method=method, batch_size=batch_size, seq_len=64).activations_bytes


def test_every_field_of_an_entry_says_what_it_means() -> None:
    for f in fields(MethodSpec):
        assert len(MethodSpec.help(f.name)) > 10, f.name


def test_rows_per_example_drive_the_memory_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    # kto runs one row per example and no fused head: dpo's two rows are kto's batch doubled
    assert (METHOD_SPECS["dpo"].rows_per_example, METHOD_SPECS["kto"].rows_per_example) == (2, 1)
    assert activations("dpo", 2) == activations("kto", 4)
    monkeypatch.setitem(METHOD_SPECS, "dpo", replace(METHOD_SPECS["dpo"], rows_per_example=3))
    assert activations("dpo", 2) == activations("kto", 6)


def test_rows_per_example_drive_the_time_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    job = {"training_type": "lora", "batch_size": 2, "gradient_accumulation_steps": 4, "max_seq_length": 64}
    per_row = Facts.of({**job, "method": "kto"}, {"tokens_per_row": 10.0}).step_tokens
    assert Facts.of({**job, "method": "dpo"}, {"tokens_per_row": 10.0}).step_tokens == 2 * per_row
    monkeypatch.setitem(METHOD_SPECS, "dpo", replace(METHOD_SPECS["dpo"], rows_per_example=3))
    assert Facts.of({**job, "method": "dpo"}, {"tokens_per_row": 10.0}).step_tokens == 3 * per_row


def test_the_fused_head_is_the_entrys(monkeypatch: pytest.MonkeyPatch) -> None:
    assert [n for n, s in METHOD_SPECS.items() if s.fused_head] == ["sft", "pretrain"]
    fused = activations("sft", 2)
    assert fused < activations("kto", 2)  # the whole batch's logits, not a tile
    monkeypatch.setitem(METHOD_SPECS, "sft", replace(METHOD_SPECS["sft"], trainer="kto"))
    assert activations("sft", 2) == activations("kto", 2)


def config(method: str) -> JobConfig:
    extra = {"reward_functions": ["exact_match"]} if method == "grpo" else {}
    return JobConfig.model_validate({"model_name": "m", "hf_dataset": "d", "method": method, **extra})


def test_the_openai_method_type_maps_through_the_entry(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    hyper = Hyperparameters(n_epochs=1, batch_size=8, learning_rate_multiplier=1.0)
    shown = {name: method_of(config(name), hyper).type for name in METHOD_SPECS}
    assert shown == {"sft": "supervised", "pretrain": "supervised", "dpo": "dpo", "grpo": "reinforcement",
                     "orpo": "orpo", "kto": "kto", "reward": "reward"}
    # the request's method types are OpenAI's, and each is an entry's: sft trains "supervised", dpo "dpo"
    assert set(get_args(MethodIn.model_fields["type"].annotation)) == set(OPENAI_TYPES)
    assert {t: (openai_method(t)[0].name, openai_method(t)[1].format) for t in OPENAI_TYPES} == {
        "supervised": ("sft", "messages"), "dpo": ("dpo", "preference")}
    body = CreateJob(model="m", training_file="file-x", method={"type": "dpo"})
    made = config_fields(body, tmp_path / "rows.jsonl", None, rows=8)
    assert (made["method"], made["format_type"]) == ("dpo", "preference")

    monkeypatch.setitem(METHOD_SPECS, "kto", replace(METHOD_SPECS["kto"], openai_type="preference_feedback"))
    assert method_of(config("kto"), hyper).type == "preference_feedback"
    file = replace(METHOD_SPECS["dpo"].openai_file, format="unpaired")
    monkeypatch.setitem(METHOD_SPECS, "dpo", replace(METHOD_SPECS["dpo"], name="kto", openai_file=file))
    made = config_fields(body, tmp_path / "rows.jsonl", None, rows=8)
    assert (made["method"], made["format_type"]) == ("kto", "unpaired")


def test_beta_from_openai_is_refused_where_the_entry_has_no_beta() -> None:
    body = CreateJob(model="m", training_file="file-x", hyperparameters={"beta": 0.5})
    with pytest.raises(ApiError, match="beta is a hyperparameter of method dpo"):
        config_fields(body, Path("rows.jsonl"), None, rows=8)
