"""Which optional libraries a training job's process leaves unimported (worker/optional.py). The real process is
checked in tests/worker/test_training.py (a LoRA job without them) and its QLoRA test (a job with bitsandbytes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tunestudio.worker.optional import BITSANDBYTES, WANDB, uses

from ..helpers.jobs import job_config


def test_a_lora_job_on_a_local_unquantized_model_uses_neither(tiny_model: Path, tmp_path: Path) -> None:
    cfg = job_config(tiny_model, tmp_path / "out")
    assert uses(cfg) == set()
    assert uses(cfg.public_dict()) == set()  # the JSON form a spawned worker, a rank or a Ray worker reads


@pytest.mark.parametrize(("overrides", "expected"), [
    ({"training_type": "qlora"}, {BITSANDBYTES}),
    ({"optim": "adamw_bnb_8bit"}, {BITSANDBYTES}),
    ({"enable_wandb": True}, {WANDB}),
    ({"report_to": ["wandb"]}, {WANDB}),
    ({"training_type": "full"}, set()),
])
def test_what_a_job_asks_for_is_used(tiny_model: Path, tmp_path: Path, overrides: dict, expected: set) -> None:
    assert uses(job_config(tiny_model, tmp_path / "out", **overrides).public_dict()) == expected


@pytest.mark.parametrize("spelling", ["QLoRA", "q-lora", "LoRA/QLoRA"])
def test_the_seeds_spellings_of_qlora_keep_bitsandbytes(tiny_model: Path, tmp_path: Path, spelling: str) -> None:
    """A file for `python -m tunestudio.worker` is read before its validation maps the seed's spellings."""
    public = job_config(tiny_model, tmp_path / "out").public_dict()
    assert uses({**public, "training_type": spelling}) == {BITSANDBYTES}
    assert uses({**public, "training_type": "LoRA"}) == set()


def test_a_model_not_known_to_be_unquantized_keeps_bitsandbytes(tiny_model: Path, tmp_path: Path) -> None:
    public = job_config(tiny_model, tmp_path / "out").public_dict()
    assert BITSANDBYTES in uses({**public, "model_name": "someorg/some-model"})  # a hub name: its config unread
    quantized = tmp_path / "prequantized"
    quantized.mkdir()
    config = json.loads((tiny_model / "config.json").read_text())
    (quantized / "config.json").write_text(json.dumps({**config, "quantization_config": {"load_in_4bit": True}}))
    assert BITSANDBYTES in uses({**public, "model_name": str(quantized)})
    (quantized / "config.json").write_text("{not json")
    assert BITSANDBYTES in uses({**public, "model_name": str(quantized)})


def test_hidden_libraries_read_as_not_installed_to_peft_and_transformers(tiny_model: Path, tmp_path: Path) -> None:
    """Without importing the modelling libraries: their own checks (find_spec) and a plain import."""
    public = job_config(tiny_model, tmp_path / "out").public_dict()
    script = f"""
import importlib.util, json, sys
from tunestudio.worker.optional import hide_unused
hidden = hide_unused(json.loads({json.dumps(json.dumps(public))}))
try:
    import bitsandbytes
    imported = True
except ImportError:
    imported = False
print(json.dumps([hidden, importlib.util.find_spec("bitsandbytes") is None, imported]))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [[BITSANDBYTES, WANDB], True, False]
