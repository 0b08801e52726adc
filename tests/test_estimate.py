"""The estimate from config.json arithmetic agrees with what torch and peft count on real model objects."""

from __future__ import annotations

import pytest

from tunestudio.estimate import estimate

SHAPES = {
    "tiny": {"vocab_size": 770, "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "intermediate_size": 344, "tie_word_embeddings": False},
    "270M-like": {"vocab_size": 262_144, "hidden_size": 640, "num_hidden_layers": 18, "num_attention_heads": 4,
                  "num_key_value_heads": 1, "intermediate_size": 2048, "tie_word_embeddings": True},
    "1B-like": {"vocab_size": 128_256, "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
                "num_key_value_heads": 8, "intermediate_size": 8192, "tie_word_embeddings": True},
}


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # peft's own call
@pytest.mark.parametrize("name", SHAPES)
def test_parameters_and_lora_parameters_are_counted_exactly(name: str) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    config = SHAPES[name]
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**config))
    total = sum(p.numel() for p in model.parameters())
    peft_model = get_peft_model(model, LoraConfig(r=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    got = estimate({**config, "model_type": "llama"}, training_type="lora", lora_r=8)
    assert got.parameters == total
    assert got.trainable_parameters == trainable
    full = estimate(config, training_type="full")
    assert full.trainable_parameters == total and full.optimizer_bytes == 8 * total


def test_large_vocabularies_make_the_logits_dominate_and_checkpointing_shrinks_activations() -> None:
    big = estimate(SHAPES["270M-like"], batch_size=4, seq_len=512)
    layers_only = estimate({**SHAPES["270M-like"], "vocab_size": 1}, batch_size=4, seq_len=512)
    assert big.activations_bytes - layers_only.activations_bytes > layers_only.activations_bytes / 2
    assert estimate(SHAPES["1B-like"], seq_len=2048, gradient_checkpointing=True).activations_bytes < \
        estimate(SHAPES["1B-like"], seq_len=2048).activations_bytes / 2


def test_a_fused_head_never_holds_the_full_logits() -> None:
    """TRL's SFTTrainer scores tokens through tiles of the head: 16k tokens x 128k entries do not exist at once."""
    plain = estimate(SHAPES["1B-like"], batch_size=8, seq_len=2048)
    fused = estimate(SHAPES["1B-like"], batch_size=8, seq_len=2048, fused_head=True)
    logits_plain = 8 * 2048 * 128_256 * 12
    assert plain.activations_bytes - fused.activations_bytes > 0.9 * logits_plain
