"""Padding-free batches: the same loss as padded ones for every verified model type, chosen when cheaper."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

SMALL = dict(vocab_size=500, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=512, pad_token_id=0)
LENGTHS = [5, 17, 30, 9]


def _losses(model_type: str, implementation: str) -> tuple[float, float]:
    """The loss of one batch of LENGTHS rows, padded and flattened (TRL's collators), on a random model."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **SMALL)
    config._attn_implementation = implementation
    model = AutoModelForCausalLM.from_config(config).float().train()
    rows = [{"input_ids": torch.randint(5, 500, (n,)).tolist()} for n in LENGTHS]
    keep = ("input_ids", "labels", "attention_mask", "position_ids")
    padded = DataCollatorForLanguageModeling(pad_token_id=0)(rows)
    flat = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(rows)
    assert flat["input_ids"].shape == (1, sum(LENGTHS)) and "attention_mask" not in flat
    with torch.no_grad():
        return tuple(float(model(use_cache=False, **{k: v for k, v in b.items() if k in keep}).loss)
                     for b in (padded, flat))


@pytest.mark.timeout(300)
def test_every_verified_model_type_keeps_its_loss_flattened() -> None:
    from tunestudio.worker.train.batching import PADDING_FREE_MODEL_TYPES

    for model_type in sorted(PADDING_FREE_MODEL_TYPES):
        for implementation in ("sdpa", "eager"):
            padded, flat = _losses(model_type, implementation)
            assert abs(padded - flat) <= 1e-5 * padded, (model_type, implementation, padded, flat)


def test_a_model_whose_attention_crosses_rows_is_not_verified() -> None:
    """gpt2 ignores packed position ids in its mask: the flattened loss differs, so it is left out."""
    from tunestudio.worker.train.batching import PADDING_FREE_MODEL_TYPES

    padded, flat = _losses("gpt2", "sdpa")
    assert abs(padded - flat) > 1e-4 * padded
    assert "gpt2" not in PADDING_FREE_MODEL_TYPES


def test_gradients_are_the_same_flattened() -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    torch.manual_seed(1)
    model = LlamaForCausalLM(LlamaConfig(**SMALL)).double().train()
    rows = [{"input_ids": torch.randint(5, 500, (n,)).tolist()} for n in LENGTHS]
    grads = []
    for collator in (DataCollatorForLanguageModeling(pad_token_id=0),
                     DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)):
        batch = {k: v for k, v in collator(rows).items() if k in ("input_ids", "labels", "attention_mask",
                                                                   "position_ids")}
        model.zero_grad()
        model(use_cache=False, **batch).loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert torch.allclose(grads[0], grads[1], rtol=1e-5, atol=1e-7)


# A 135M Llama with a 128k vocabulary (SmolLM-like), where these choices were measured (batching.py's note).
REAL = SimpleNamespace(hidden_size=576, num_hidden_layers=12, num_attention_heads=9, num_key_value_heads=3,
                       head_dim=64, intermediate_size=1536, vocab_size=128256, _attn_implementation="sdpa")


@pytest.mark.parametrize(("lengths", "flat"), [
    ([20, 35, 60, 110], True),  # measured 1.6-1.8x faster flattened
    ([100, 250, 400, 512], True),  # 1.5-1.8x
    ([30, 60, 90, 120, 40, 70, 100, 128], True),  # 1.45-1.8x
    ([512, 512, 512, 512], False),  # 0.81-0.91x: nothing to save, the dense mask costs
    ([128] * 8, False),  # 0.92-0.95x
    ([500, 512, 490, 505], False),  # 0.80-0.89x
    ([64], False),  # one row: nothing to flatten
])
def test_the_cost_model_picks_what_was_measured_faster(lengths: list[int], flat: bool) -> None:
    from tunestudio.worker.train.batching import Costs

    assert Costs.of(REAL).flat_pays(lengths) is flat


def test_flash_attention_flattens_whenever_there_is_padding() -> None:
    from tunestudio.worker.train.batching import Costs

    costs = Costs.of(SimpleNamespace(**{**vars(REAL), "_attn_implementation": "flash_attention_2"}))
    assert costs.varlen and costs.flat_pays([512, 500]) and not costs.flat_pays([512, 512])


def test_the_collator_chooses_per_batch_and_counts() -> None:
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from tunestudio.worker.train.batching import ChoosingCollator, Costs

    collator = ChoosingCollator(DataCollatorForLanguageModeling(pad_token_id=0),
                                DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True), Costs.of(REAL))
    short = collator([{"input_ids": list(range(1, n + 1))} for n in (20, 35, 60, 110)])
    even = collator([{"input_ids": list(range(1, 129))} for _ in range(8)])
    assert short["input_ids"].shape == (1, 225) and "position_ids" in short
    assert even["input_ids"].shape == (8, 128) and "attention_mask" in even
    assert (collator.batches, collator.flattened) == (2, 1)


def test_padding_free_true_on_an_unverified_model_is_refused() -> None:
    from transformers import GPT2Config
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from tunestudio.worker.train import batching

    trainer = SimpleNamespace(data_collator=DataCollatorForLanguageModeling(pad_token_id=0),
                              args=SimpleNamespace(packing=False), model=SimpleNamespace(config=GPT2Config()))
    with pytest.raises(ValueError, match="padding_free: not verified for model type 'gpt2'"):
        batching.install(trainer, True)
    batching.install(trainer, "auto")
    assert isinstance(trainer.data_collator, DataCollatorForLanguageModeling)
    assert "is not verified" in batching.describe(trainer, "auto")


@pytest.mark.timeout(300)
def test_a_job_trains_padding_free_with_the_same_first_loss(tiny_model: Path, tmp_path: Path) -> None:
    from tunestudio.events import Log, Progress

    from ..helpers.jobs import job_config, run_job

    runs = {setting: run_job(job_config(tiny_model, tmp_path / str(setting), padding_free=setting, max_steps=4,
                                        precision="fp32"))
            for setting in (True, False)}
    assert all(r.outcome.kind == "completed" for r in runs.values())
    on = [e.message for e in runs[True].of(Log) if e.message.startswith("padding-free")]
    # every batch formed (the data loader reads one ahead of the 4 steps) was flattened
    assert on[0] == "padding-free batches: on"
    assert re.fullmatch(r"padding-free batches: (\d+) of \1 flattened", on[-1]) and int(on[-1].split()[2]) >= 4
    assert not any(e.message.startswith("padding-free") for e in runs[False].of(Log))
    # the worker computes TRL's fused head with worker/train/lmhead.py on a CPU (tests/worker/test_lmhead.py)
    assert any(e.message.startswith("LM head: TRL's fused log-probabilities") for e in runs[True].of(Log))
    first_on, first_off = runs[True].losses[0][1], runs[False].losses[0][1]
    assert abs(first_on - first_off) <= 1e-4 * first_off
    # tokens/s counts real tokens either way: the same rows, so the same count after one step
    assert runs[True].of(Progress)[0].num_tokens == runs[False].of(Progress)[0].num_tokens
