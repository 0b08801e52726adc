from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tunestudio.config import ConfigError, JobConfig, TrainingType, format_validation_error, load_config

from .helpers.jobs import DATA

ALPACA = str(DATA / "alpaca.jsonl")


def valid(**overrides: Any) -> dict[str, Any]:
    return {"model_name": "org/model", "local_datasets": [ALPACA], **overrides}


def fields_of(error: ValidationError) -> set[str]:
    return {e["field"] for e in format_validation_error(error)}


INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("batch size zero", {"batch_size": 0}, "batch_size"),
    ("negative batch size", {"batch_size": -4}, "batch_size"),
    ("learning rate abc", {"learning_rate": "abc"}, "learning_rate"),
    ("negative learning rate", {"learning_rate": -1e-4}, "learning_rate"),
    ("unknown key", {"bach_size": 8}, "bach_size"),
    ("missing model", {"model_name": None}, "model_name"),
    ("empty model", {"model_name": "  "}, "model_name"),
    ("infinite max_steps", {"max_steps": float("inf")}, "max_steps"),
    ("NaN learning rate", {"learning_rate": float("nan")}, "learning_rate"),
    ("Infinity epochs", {"num_epochs": "Infinity"}, "num_epochs"),
    ("NaN eval steps", {"eval_steps": float("nan")}, "eval_steps"),
    ("huge max_steps", {"max_steps": 10**18}, "max_steps"),
    ("huge save_steps", {"save_steps": 2**63}, "save_steps"),
    ("huge slice", {"dataset_slice_start": 2**70}, "dataset_slice_start"),
    ("slice end before start", {"dataset_slice_start": 10, "dataset_slice_end": 5}, "dataset_slice_end"),
    ("lora_r zero", {"lora_r": 0}, "lora_r"),
    ("unknown training type", {"training_type": "dora"}, "training_type"),
    ("no dataset", {"local_datasets": []}, "local_datasets"),
    ("both datasets", {"hf_dataset": "org/data"}, "hf_dataset"),
    ("lora dropout 1", {"lora_dropout": 1.0}, "lora_dropout"),
    ("unknown precision", {"precision": "int3"}, "precision"),
    ("unknown optimizer", {"optim": "adamw_quantum"}, "optim"),
    ("unknown scheduler", {"lr_scheduler_type": "zigzag"}, "lr_scheduler_type"),
    ("fractional eval steps above one", {"eval_steps": 2.5}, "eval_steps"),
    ("negative eval steps", {"eval_steps": -1}, "eval_steps"),
    ("warmup steps and ratio", {"warmup_steps": 5, "warmup_ratio": 0.1}, "warmup_ratio"),
    ("warmup ratio 1", {"warmup_ratio": 1.0}, "warmup_ratio"),
    ("zero epochs", {"num_epochs": 0}, "num_epochs"),
    ("4-bit with lora", {"training_type": "lora", "load_in_4bit": True}, "load_in_4bit"),
    ("loftq with full", {"training_type": "full", "use_loftq": True}, "use_loftq"),
    ("image dataset with a text-only method", {"is_dataset_image": True, "method": "orpo"}, "method"),
    ("image dataset with neither side trained",
     {"is_dataset_image": True, "finetune_vision_layers": False, "finetune_language_layers": False},
     "finetune_vision_layers"),
    ("audio dataset with a text-only method", {"is_dataset_audio": True, "method": "dpo"}, "method"),
    ("audio dataset with sample prompts", {"is_dataset_audio": True, "sample_prompts": ["hi"]}, "sample_prompts"),
    ("audio language on a text job", {"audio_language": "en"}, "audio_language"),
    ("no language layers", {"finetune_language_layers": False}, "finetune_language_layers"),
    ("mapping without assistant", {"custom_format_mapping": {"q": "user"}}, "custom_format_mapping"),
    ("mapping to unknown role", {"custom_format_mapping": {"q": "user", "a": "oracle"}}, "custom_format_mapping"),
    ("max_seq_length tiny", {"max_seq_length": 2}, "max_seq_length"),
    ("unknown format", {"format_type": "xml"}, "format_type"),
    ("latest without output_dir", {"resume_from_checkpoint": "latest"}, "resume_from_checkpoint"),
    ("batch size as text", {"batch_size": "eight"}, "batch_size"),
    ("early stopping without evaluations", {"early_stopping": {"metric": "eval_loss"}}, "early_stopping"),
    ("early stopping on an unknown metric", {"eval_steps": 5, "early_stopping": {"metric": "bleu"}},
     "early_stopping.metric"),
    ("early stopping on another method's metric", {"eval_steps": 5, "early_stopping": {"metric": "rewards/margins"}},
     "early_stopping.metric"),
    ("early stopping on answers of rows without replies",
     {"eval_steps": 5, "format_type": "text", "early_stopping": {"metric": "exact_match"}}, "early_stopping.metric"),
    ("early stopping with an unknown key", {"eval_steps": 5, "early_stopping": {"metric": "eval_loss", "wait": 3}},
     "early_stopping.wait"),
    ("early stopping patience 0", {"eval_steps": 5, "early_stopping": {"patience": 0}}, "early_stopping.patience"),
    ("early stopping NaN delta", {"eval_steps": 5, "early_stopping": {"min_delta": "NaN"}}, "early_stopping.min_delta"),
    ("early stopping rows with eval_loss", {"eval_steps": 5, "early_stopping": {}, "early_stopping_rows": 8},
     "early_stopping_rows"),
    ("generation metric without rows", {"eval_steps": 5, "eval_generate_rows": 0,
                                        "early_stopping": {"metric": "token_f1"}}, "early_stopping_rows"),
    ("keep_best off without early stopping", {"keep_best": False}, "keep_best"),
]


@pytest.mark.parametrize(("overrides", "field"), [(o, f) for _, o, f in INVALID], ids=[n for n, _, _ in INVALID])
def test_invalid_config_names_the_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        JobConfig.model_validate(valid(**overrides))
    named = fields_of(info.value)
    assert any(f == field or f.startswith(field + ".") for f in named), format_validation_error(info.value)


def test_at_least_fifteen_kinds_of_invalid_config() -> None:
    assert len({field for _, _, field in INVALID}) >= 15


def test_defaults_live_in_the_model() -> None:
    cfg = JobConfig.model_validate(valid())
    assert cfg.training_type is TrainingType.lora
    assert cfg.learning_rate == 2e-4
    assert (cfg.batch_size, cfg.gradient_accumulation_steps, cfg.lora_r) == (2, 4, 16)
    assert cfg.format_type == "auto"
    assert cfg.local_datasets == [ALPACA]  # as given: paths are resolved at submit (tunestudio.paths)


def test_every_number_has_bounds() -> None:
    """No int or float field without an upper bound: nothing a client sends can overflow a column or a loop."""
    import annotated_types

    for name, info in JobConfig.model_fields.items():
        kinds = {a for a in getattr(info.annotation, "__args__", (info.annotation,)) if a is not type(None)}
        if kinds & {int, float} and not kinds & {bool, str}:
            uppers = [m for m in info.metadata if isinstance(m, (annotated_types.Le, annotated_types.Lt))]
            assert uppers, f"{name} has no upper bound"


@pytest.mark.parametrize("twice", [[ALPACA] * 256, ["./data/a.jsonl", "data/a.jsonl"], ["data/", "data"],
                                   ["/nope/x.jsonl", "b.jsonl", "/nope//x.jsonl"]],
                         ids=["256 copies", "dot slash", "trailing slash", "double slash"])
def test_a_dataset_listed_twice_is_refused_as_written(twice: list[str]) -> None:
    """256 copies of a 400-row file trained on 102,400 rows (issue 30); paths compare as written, no filesystem."""
    with pytest.raises(ValidationError) as info:
        JobConfig.model_validate(valid(local_datasets=twice))
    (error,) = format_validation_error(info.value)
    assert error["field"] == "local_datasets" and "listed twice" in error["message"], error
    listed = ["a.jsonl", "data/a.jsonl", "../a.jsonl", "/nope/a.jsonl"]  # different names: the paths step decides
    assert JobConfig.model_validate(valid(local_datasets=listed)).local_datasets == listed


def test_validation_does_no_io(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing dataset or model folder is the paths step's business, not the model's."""
    cfg = JobConfig.model_validate(valid(local_datasets=["/nonexistent/data.jsonl"], model_name="./no/such/model"))
    assert cfg.local_datasets == ["/nonexistent/data.jsonl"] and cfg.model_name == "./no/such/model"


@pytest.mark.parametrize(
    ("training_type", "load_in_4bit", "expected", "four_bit"),
    [
        ("LoRA/QLoRA", True, TrainingType.qlora, True),
        ("LoRA/QLoRA", False, TrainingType.lora, False),
        ("Full Finetuning", True, TrainingType.full, False),
        ("qlora", None, TrainingType.qlora, True),
        ("LORA", None, TrainingType.lora, False),
    ],
)
def test_seed_training_type_spellings(
    training_type: str, load_in_4bit: bool | None, expected: TrainingType, four_bit: bool
) -> None:
    extra = {} if load_in_4bit is None else {"load_in_4bit": load_in_4bit}
    cfg = JobConfig.model_validate(valid(training_type=training_type, **extra))
    assert cfg.training_type is expected
    assert cfg.load_in_4bit is four_bit


def test_seed_values_are_accepted() -> None:
    cfg = JobConfig.model_validate(
        valid(learning_rate="2e-4", gradient_checkpointing="unsloth", optim="adamw_8bit", format_type="",
              hf_dataset="", eval_split="", warmup_steps="", target_modules="all-linear",
              custom_format_mapping={"question": "human", "answer": "gpt"})
    )
    assert cfg.learning_rate == pytest.approx(2e-4)
    assert cfg.gradient_checkpointing == "unsloth"
    assert cfg.optim == "adamw_8bit"
    assert cfg.format_type == "auto"
    assert cfg.hf_dataset is None and cfg.eval_split is None and cfg.warmup_steps is None
    assert cfg.target_modules is None
    assert cfg.custom_format_mapping == {"question": "user", "answer": "assistant"}


def test_secrets_never_serialised() -> None:
    cfg = JobConfig.model_validate(valid(hf_token="hf_SECRET123", wandb_token="wb_SECRET456"))
    dumped = json.dumps(cfg.public_dict())
    assert "SECRET" not in dumped and "hf_token" not in dumped
    assert "SECRET" not in repr(cfg) and "SECRET" not in cfg.model_dump_json()
    assert cfg.secrets() == {"hf_token": "hf_SECRET123", "wandb_token": "wb_SECRET456"}
    again = JobConfig.from_parts(cfg.public_dict(), cfg.secrets())
    assert again.hf_token is not None and again.hf_token.get_secret_value() == "hf_SECRET123"


def test_public_dict_round_trips() -> None:
    cfg = JobConfig.model_validate(valid(training_type="qlora", eval_steps=0.1, output_dir="out"))
    assert JobConfig.model_validate(cfg.public_dict()) == cfg


def test_early_stopping_takes_the_jobs_metrics_and_keeps_the_best_by_default() -> None:
    cfg = JobConfig.model_validate(valid(eval_steps=10, early_stopping={"metric": "exact_match"}))
    assert cfg.early_stopping is not None and cfg.keep_best and cfg.early_stopping_rows is None
    assert (cfg.early_stopping.patience, cfg.early_stopping.min_delta, cfg.early_stopping.direction) == (3, 0.0, "max")
    assert JobConfig.model_validate(valid(eval_steps=0.2, early_stopping={})).early_stopping.direction == "min"
    # The method's metric on the eval split, as TRL logs it: "eval_" + its name, either spelling accepted.
    dpo = JobConfig.model_validate(valid(method="dpo", eval_steps=10, early_stopping={"metric": "rewards/margins"}))
    assert dpo.early_stopping.metric == "eval_rewards/margins" and dpo.early_stopping.direction == "max"
    as_logged = {"metric": "eval_exact_match", "mode": "min"}
    again = JobConfig.model_validate(valid(eval_steps=10, early_stopping=as_logged, early_stopping_rows=4))
    assert again.early_stopping.metric == "exact_match" and again.early_stopping.direction == "min"
    assert JobConfig.model_validate(valid(early_stopping="")).early_stopping is None  # blank is unset
    assert JobConfig.model_validate(again.public_dict()) == again


def test_load_yaml_and_json(tmp_path: Path) -> None:
    yml = tmp_path / "job.yaml"
    yml.write_text(f"model_name: org/model\nlocal_datasets: {ALPACA}\nlearning_rate: 2e-4\n")
    assert load_config(yml).learning_rate == pytest.approx(2e-4)  # YAML reads 2e-4 as text
    js = tmp_path / "job.json"
    js.write_text(json.dumps(valid(batch_size=4)))
    assert load_config(js).batch_size == 4


def test_load_config_reports_every_bad_field(tmp_path: Path) -> None:
    yml = tmp_path / "job.yaml"
    yml.write_text(f"model_name: org/model\nlocal_datasets: [{ALPACA}]\nbatch_size: 0\nlora_r: 0\ncolour: red\n")
    with pytest.raises(ConfigError) as info:
        load_config(yml)
    text = str(info.value)
    assert "batch_size" in text and "lora_r" in text and "colour" in text
    assert "Traceback" not in text


def test_load_config_bad_yaml(tmp_path: Path) -> None:
    yml = tmp_path / "job.yaml"
    yml.write_text("model_name: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(yml)


# --- the config is pure: validating its own dump gives it back ------------------------------------------
_FIELD_VALUES = {
    "training_type": st.sampled_from(["lora", "qlora", "full", "LoRA/QLoRA", "Full Finetuning"]),
    "max_seq_length": st.integers(8, 1_048_576),
    "precision": st.sampled_from(["auto", "fp32", "bf16", "fp16"]),
    "format_type": st.sampled_from(["auto", "alpaca", "sharegpt", "messages", "chatml", "", None, "completion"]),
    "eval_split": st.sampled_from([None, "", "test", "data/val.jsonl"]),
    "eval_steps": st.one_of(st.floats(0, 0.99), st.integers(1, 10_000).map(float)),
    "num_epochs": st.floats(0.01, 100),
    "learning_rate": st.one_of(st.floats(1e-8, 1.0), st.sampled_from(["2e-4", "1e-3"])),
    "batch_size": st.integers(1, 65_536),
    "warmup_steps": st.one_of(st.none(), st.integers(0, 1000), st.just("")),
    "max_steps": st.integers(0, 10**6),
    "lora_r": st.integers(1, 4096),
    "lora_dropout": st.floats(0, 0.99),
    "target_modules": st.sampled_from([None, "all-linear", "q_proj, v_proj", ["q_proj"], []]),
    "gradient_checkpointing": st.sampled_from([True, False, "auto", "unsloth", "on", "off"]),
    "padding_free": st.sampled_from([True, False, "auto", "on", "off"]),
    "optim": st.sampled_from(["adamw_torch", "ADAMW_8BIT", " sgd "]),
    "output_dir": st.sampled_from([None, "", "out", "/tmp/x/out"]),
    "tensorboard_dir": st.sampled_from(["runs", "/tmp/tb"]),
    "resume_from_checkpoint": st.sampled_from([None, "/tmp/x/checkpoint-3"]),
    "custom_format_mapping": st.sampled_from([None, {"q": "human", "a": "gpt"}]),
    "sample_prompts": st.lists(st.text(max_size=20), max_size=3),
    "hf_token": st.sampled_from([None, "", "hf_abc"]),
    "wandb_token": st.sampled_from([None, "wb_abc"]),
    "dataset_slice_start": st.one_of(st.none(), st.integers(0, 10)),
    "early_stopping": st.one_of(st.none(), st.fixed_dictionaries({}, optional={
        "metric": st.sampled_from(["eval_loss", "exact_match", "eval_rouge_l", "token_f1", "rewards/margins"]),
        "patience": st.integers(1, 100), "min_delta": st.floats(0, 10), "mode": st.sampled_from(["auto", "min", "max"]),
    })),
    "keep_best": st.booleans(),
    "early_stopping_rows": st.one_of(st.none(), st.integers(1, 1000)),
}


@settings(max_examples=300, deadline=None)
@given(st.fixed_dictionaries({}, optional=_FIELD_VALUES))
def test_validating_a_configs_own_dump_gives_it_back(fields: dict[str, Any]) -> None:
    try:
        cfg = JobConfig.model_validate(valid(**fields))
    except ValidationError:
        assume(False)
    assert JobConfig.model_validate(cfg.public_dict() | cfg.secrets()) == cfg
