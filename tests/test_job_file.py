"""A job file written from a config (`config.dump_config`) is read back by the CLI's reader as the same config:
only what differs from the defaults is written, a method's own defaults are spelled out where leaving them
out would read differently, and no secret is ever in it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tunestudio.config import ConfigError, JobConfig, load_config
from tunestudio.config.files import dump_config, job_file_fields, load_job_file, parse_config_text

BASE = {"model_name": "/models/m", "local_datasets": ["/data/train.jsonl"]}
CASES: list[dict[str, Any]] = [
    {},
    {"training_type": "qlora", "learning_rate": 0.0007, "sample_prompts": ["two\nlines", "emoji 🐄: 'q' #1"]},
    {"method": "pretrain", "packing": False},  # pretrain packs unless told not to: the file must say so
    {"method": "dpo", "beta": 0.3, "early_stopping": {"metric": "eval_loss", "patience": 2}, "eval_steps": 5},
    {"hf_token": "hf_SecretValue", "wandb_token": "w_SecretValue", "max_steps": 3},
]


@pytest.mark.parametrize("fields", CASES)
def test_a_written_job_file_loads_as_the_same_config(fields: dict[str, Any], tmp_path: Path) -> None:
    cfg = JobConfig.model_validate({**BASE, **fields})
    path = tmp_path / "job.yaml"
    path.write_text(dump_config(cfg, "a header\nof two lines"), encoding="utf-8")
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# a header\n# of two lines\n")
    assert "Secret" not in text
    assert load_config(path).public_dict() == cfg.public_dict()
    assert load_config(path).secrets() == {}


def test_only_what_differs_from_the_defaults_is_written_and_left_out_fields_are_not() -> None:
    cfg = JobConfig.model_validate({**BASE, "max_steps": 3, "output_dir": "/out"})
    assert job_file_fields(cfg) == {**BASE, "max_steps": 3, "output_dir": "/out"}
    assert "output_dir" not in yaml.safe_load(dump_config(cfg, leave_out=["output_dir"]))


def test_whole_numbers_stay_whole_and_the_jobs_name_is_a_field(tmp_path: Path) -> None:
    """Issue 38 finding 16: a form's 10 (JSON's int, the float field's 10.0) is written `eval_steps: 10`, and the
    job's name is the file's first field, read back with the same config."""
    cfg = JobConfig.model_validate({**BASE, "eval_steps": 10, "num_epochs": 2, "learning_rate": 0.5})
    text = dump_config(cfg, "job j1", name="lr 0.5: a cow's sound")
    assert "eval_steps: 10\n" in text and "num_epochs: 2\n" in text and "learning_rate: 0.5\n" in text
    assert text.splitlines()[1].startswith("name: ")  # the first field, below the comment
    path = tmp_path / "job.yaml"
    path.write_text(text, encoding="utf-8")
    config, name = load_job_file(path)
    assert name == "lr 0.5: a cow's sound" and config.public_dict() == cfg.public_dict()
    assert load_config(path).public_dict() == cfg.public_dict() and parse_config_text(text) == (config, name)
    assert parse_config_text(dump_config(cfg) + "name: '  '\n")[1] is None  # a blank name is none
    for bad in ("name: [a list]\n", f"name: {'x' * 201}\n"):
        with pytest.raises(ConfigError, match="name"):
            parse_config_text("model_name: m\n" + bad)
