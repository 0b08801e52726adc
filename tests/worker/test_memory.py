"""gradient_checkpointing auto: on only when the estimated memory would not fit in what is free."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunestudio.config import JobConfig
from tunestudio.estimate import HEADROOM

GIB = 2**30
# A 1B-like Llama (128k vocabulary): a full fine-tune at batch 8 x 2048 needs tens of GiB of activations.
ONE_B = {"model_type": "llama", "vocab_size": 128_256, "hidden_size": 2048, "num_hidden_layers": 16,
         "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 8192, "tie_word_embeddings": True}


def _cfg(**fields: object) -> JobConfig:
    return JobConfig.model_validate({"model_name": "m", "output_dir": "/tmp/x", "local_datasets": ["d.jsonl"],
                                     **fields})


def test_auto_is_the_default_and_off_when_the_job_fits() -> None:
    from tunestudio.worker.train import memory

    cfg = _cfg(batch_size=2, max_seq_length=512)
    assert cfg.gradient_checkpointing == "auto"
    choice = memory.decide(cfg, ONE_B, "bf16", free=64 * GIB)
    assert not choice.on
    assert choice.note.startswith("activation checkpointing auto → off (the job needs about ")
    assert choice.note.endswith("64.0 GiB free)")


def test_auto_turns_on_when_only_checkpointing_makes_the_job_fit() -> None:
    from tunestudio.worker.train import memory

    cfg = _cfg(training_type="full", batch_size=8, max_seq_length=2048)
    without = memory.needs(cfg, ONE_B, "bf16", checkpointing=False).beyond_weights
    with_it = memory.needs(cfg, ONE_B, "bf16", checkpointing=True).beyond_weights
    assert with_it < without
    free = int((with_it + without) / 2 / HEADROOM)  # room for the job with it, not without
    choice = memory.decide(cfg, ONE_B, "bf16", free=free)
    assert choice.on and "without it the job needs about" in choice.note and "may still not fit" not in choice.note
    starved = memory.decide(cfg, ONE_B, "bf16", free=with_it // 2)
    assert starved.on and "may still not fit" in starved.note


def test_preference_methods_count_two_rows_per_example() -> None:
    from tunestudio.worker.train import memory

    sft = memory.needs(_cfg(batch_size=4), ONE_B, "fp32", False)
    dpo = memory.needs(_cfg(method="dpo", batch_size=4), ONE_B, "fp32", False)
    assert dpo.activations_bytes > 2 * sft.activations_bytes  # twice the rows, and full logits (no fused head)
    assert dpo.weights_bytes == sft.weights_bytes


def test_unknown_memory_or_shape_leaves_it_off() -> None:
    from tunestudio.worker.train import memory

    assert not memory.decide(_cfg(), ONE_B, "fp32", free=None).on
    assert "shape is unknown" in memory.decide(_cfg(), {"model_type": "odd"}, "fp32", free=GIB).note


def test_available_memory_is_read_and_shared_by_the_ranks_here(monkeypatch: pytest.MonkeyPatch) -> None:
    from tunestudio.worker.train import memory

    alone = memory.available_bytes()
    assert alone is not None and alone > 0
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    shared = memory.available_bytes()
    assert shared is not None and shared < alone  # MemAvailable moves, but not by a factor of 4


def test_the_worker_resolves_auto_on_the_loaded_model(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoModelForCausalLM

    from tunestudio.worker.train import memory, train

    from ..helpers.channel import ListChannel

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    cfg = _cfg(model_name=str(tiny_model))
    precision = train.precision_named("fp32")
    channel = ListChannel()
    assert train.resolve_gradient_checkpointing(cfg, channel, model, precision) is False
    monkeypatch.setattr(memory, "available_bytes", lambda: 1024)  # nothing free: checkpointing is the only hope
    assert train.resolve_gradient_checkpointing(cfg, channel, model, precision) is True
    notes = [line for line in channel.lines if "activation checkpointing auto" in line]
    assert len(notes) == 2 and "→ off" in notes[0] and "→ on" in notes[1]
    assert train.resolve_gradient_checkpointing(_cfg(gradient_checkpointing=False), channel, model, precision) is False


@pytest.mark.parametrize("free_gib", [1, 4, 12, 40, 200])
def test_the_page_says_what_the_worker_will_decide(free_gib: int) -> None:
    """One memory model: the estimate before Start (api/estimate.py) and the worker's auto give the same answer
    for the same free memory once the weights are loaded."""
    from tunestudio.api.estimate import estimate
    from tunestudio.estimate import RUNTIME_BYTES
    from tunestudio.worker.train import memory

    cfg = _cfg(training_type="full", batch_size=4, max_seq_length=2048)
    worker = memory.decide(cfg, ONE_B, "fp32", free=free_gib * GIB)
    weights = memory.needs(cfg, ONE_B, "fp32", False).weights_bytes
    job = {name: getattr(cfg, name) for name in ("batch_size", "max_seq_length", "gradient_accumulation_steps",
                                                 "lora_r", "target_modules", "finetune_attention_modules",
                                                 "finetune_mlp_modules", "gradient_checkpointing", "optim")}
    job |= {"training_type": "full", "method": "sft", "precision": "fp32", "model_name": "m"}
    machine = {"memory": {"available_mb": (free_gib * GIB + weights + RUNTIME_BYTES) / 2**20},
               "cpu": {"physical_cores": 2}}
    page = estimate(ONE_B, job, machine)
    said = next(n for n in page.notes if n.startswith("activation checkpointing auto"))
    assert ("on," in said) == worker.on, (said, worker.note)
