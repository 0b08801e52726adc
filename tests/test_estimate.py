"""The memory model from config.json arithmetic: counts agree with what torch and peft count on real model objects."""

from __future__ import annotations

import pytest

from tunestudio.estimate import EstimateUnavailable, Shape, memory

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
    got = memory({**config, "model_type": "llama"}, training_type="lora", lora_r=8)
    assert got.parameters == total
    assert got.trainable == trainable and got.adapter_bytes == 4 * trainable
    full = memory(config, training_type="full")
    assert full.trainable == total and full.optimizer_bytes == 8 * total and full.adapter_bytes == 0
    with torch.device("meta"):
        fresh = LlamaForCausalLM(LlamaConfig(**config))
    attention_only = get_peft_model(fresh, LoraConfig(r=8, target_modules=["q_proj", "v_proj"],
                                                      task_type="CAUSAL_LM"))
    qv = sum(p.numel() for p in attention_only.parameters() if p.requires_grad)
    assert memory(config, lora_r=8, target_modules=["q_proj", "v_proj"]).trainable == qv


def test_large_vocabularies_make_the_logits_dominate_and_checkpointing_shrinks_activations() -> None:
    big = memory(SHAPES["270M-like"], method="dpo", batch_size=4, seq_len=512)  # DPO: full logits
    assert big.logits_bytes > (big.activations_bytes - big.logits_bytes) / 2
    assert memory(SHAPES["1B-like"], seq_len=2048, checkpointing=True).activations_bytes < \
        memory(SHAPES["1B-like"], seq_len=2048).activations_bytes / 2


def test_a_fused_head_never_holds_the_full_logits() -> None:
    """TRL's SFTTrainer scores tokens through tiles of the head: 16k tokens x 128k entries do not exist at once."""
    plain = memory(SHAPES["1B-like"], method="kto", batch_size=8, seq_len=2048)
    fused = memory(SHAPES["1B-like"], method="sft", batch_size=8, seq_len=2048)
    logits_plain = 8 * 2048 * 128_256 * 12
    assert plain.activations_bytes - fused.activations_bytes > 0.9 * logits_plain
    assert fused.logits_bytes < logits_plain / 20


def test_weights_are_fp32_as_loaded_and_qlora_blocks_are_four_bit() -> None:
    """worker/train/model.py loads every model in fp32 (bf16 is autocast): the precision sizes activations only."""
    fp32 = memory(SHAPES["1B-like"], precision="fp32")
    bf16 = memory(SHAPES["1B-like"], precision="bf16")
    assert fp32.weights_bytes == bf16.weights_bytes == 4 * fp32.parameters
    assert bf16.activations_bytes < fp32.activations_bytes
    qlora = memory(SHAPES["1B-like"], training_type="qlora")
    _, linear = Shape.of(SHAPES["1B-like"]).parameters()
    assert qlora.weights_bytes == pytest.approx(linear * 0.535 + (qlora.parameters - linear) * 4, rel=1e-6)


def test_shapes_from_other_configs_and_a_clear_error_without_one() -> None:
    inner = {"model_type": "gemma3", "text_config": SHAPES["270M-like"], "vision_config": {"hidden_size": 1152}}
    assert memory(inner).parameters == memory(SHAPES["270M-like"]).parameters  # multimodal: its text_config
    neox = Shape.of({"model_type": "gpt_neox", "hidden_size": 512, "num_hidden_layers": 6, "num_attention_heads": 8,
                     "vocab_size": 50_304})
    assert neox.mlp_matrices == 2 and "gate_proj" not in neox.linears() and neox.intermediate == 2048
    with pytest.raises(EstimateUnavailable, match="hidden_size"):
        memory({"model_type": "odd"})


def test_a_speech_encoder_decoder_is_not_estimated_with_a_decoders_formulas() -> None:
    import json

    from tunestudio.api.estimate import EstimateUnavailable, estimate

    from .helpers.audio import WHISPER

    with pytest.raises(EstimateUnavailable, match="speech encoder-decoder \\(whisper\\)"):
        estimate(json.loads((WHISPER / "config.json").read_text()), {}, {})
