"""A real-shaped chat model for the inference benchmarks: ~256M parameters, a 262,144-token vocabulary.

Shaped like the 270M model of issue 29 (Gemma-3-270M: hidden 640, 18 layers, intermediate 2048, tied
embeddings over a 262k vocabulary), as a Llama (10 heads of 64, 2 KV heads) so that llama.cpp's
converter and runtime take it as they take any Llama. There is no model hub here, so the weights are
random (seeded), with the embedded tiny model's byte-level tokenizer (~550 tokens): a short pre-training
took minutes per step on the shared 2 cores. So that the model writes text (a random model greedily
repeats whatever token scores highest, often an id past the tokenizer's end or half a character: nothing
would stream), the embedding rows (tied: also the output layer's) of every token that is not a whole
character or more of text are scaled down by 10: those tokens never win an argmax, and each still costs
its full row of the output layer, which is what the benchmark measures.

    .venv/bin/python bench/chat_model.py DIR   # builds DIR once (config.json there: kept)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

VOCAB = 262_144
SHAPE = {"hidden_size": 640, "intermediate_size": 2048, "num_hidden_layers": 18, "num_attention_heads": 10,
         "num_key_value_heads": 2, "max_position_embeddings": 2048}


def build(directory: Path, seed: int = 1234) -> int:
    """Build and save the model with its tokenizer in `directory`; returns the parameter count."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from worker_overhead import build_tokenizer

    tokenizer = build_tokenizer()
    tokenizer.model_max_length = SHAPE["max_position_embeddings"]
    config = LlamaConfig(vocab_size=VOCAB, **SHAPE, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    special = set(tokenizer.all_special_ids)
    text = [i for i in range(len(tokenizer)) if i not in special
            and (piece := tokenizer.decode([i])).strip() and "\ufffd" not in piece]
    with torch.no_grad():
        scale = torch.full((VOCAB, 1), 0.1)
        scale[text] = 1.0
        model.model.embed_tokens.weight.mul_(scale)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


def ensure(directory: Path) -> Path:
    """The model in `directory`, built if it is not there yet."""
    if not (directory / "config.json").is_file():
        params = build(directory)
        print(f"built {directory}: {params:,} parameters, vocabulary {VOCAB:,}", flush=True)
    return directory


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", type=Path)
    args = parser.parse_args()
    ensure(args.directory.resolve())
