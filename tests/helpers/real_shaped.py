"""A model shaped like real ones, built locally: a Llama of ~116M parameters with a 128k vocabulary (Llama 3's
size), random weights, and the tiny model's byte-level tokenizer (its ids are the vocabulary's first 551).

Defaults must be right for models of this shape, not only for the tiny one; tests that train it keep to a few
steps. It is built in a child process (the test process stays as light as a user's parent process).
"""

from __future__ import annotations

import multiprocessing as mp
import shutil
from pathlib import Path

SHAPE = dict(vocab_size=128_256, hidden_size=576, intermediate_size=1536, num_hidden_layers=12,
             num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048, tie_word_embeddings=True)


def _build(directory: str, tokenizer_from: str) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_from)
    config = LlamaConfig(**SHAPE, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    model = LlamaForCausalLM(config)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def build_real_shaped(directory: Path, tiny_model: Path) -> Path:
    if (directory / "config.json").is_file() and (directory / "model.safetensors").is_file():
        return directory
    shutil.rmtree(directory, ignore_errors=True)
    proc = mp.get_context("spawn").Process(target=_build, args=(str(directory), str(tiny_model)))
    proc.start()
    proc.join(600)
    assert proc.exitcode == 0, "building the real-shaped model failed"
    return directory


# SmolVLM-256M-Instruct's published configuration, typed in (source: HuggingFaceTB/SmolVLM-256M-Instruct,
# config.json on the Hugging Face hub: an Idefics3 model, SmolLM2-135M's language model and SigLIP
# base-patch16-512's vision tower, pixel shuffle 4). The fields a model's shape depends on; the rest are
# transformers' defaults. Random weights where a test builds it.
SMOLVLM_256M: dict = {
    "model_type": "idefics3", "architectures": ["Idefics3ForConditionalGeneration"], "image_token_id": 49190,
    "scale_factor": 4, "tie_word_embeddings": False,
    "text_config": {"model_type": "llama", "vocab_size": 49280, "hidden_size": 576, "intermediate_size": 1536,
                    "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
                    "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 100000,
                    "tie_word_embeddings": False},
    "vision_config": {"model_type": "idefics3_vision", "hidden_size": 768, "intermediate_size": 3072,
                      "num_hidden_layers": 12, "num_attention_heads": 12, "num_channels": 3, "image_size": 512,
                      "patch_size": 16},
}
