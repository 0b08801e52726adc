"""The embedded tiny model and the bundled dataset, built locally from a seed.

`write_dataset` needs nothing heavy; `build_tiny_model` trains a byte-level BPE
tokenizer on the dataset and initialises a small Llama, then saves both with
`save_pretrained`, so every other part of the project loads them through the
ordinary `from_pretrained` path, exactly as it would load a hub model.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

DEFAULT_SEED = 1234
DEFAULT_ROWS = 400
PRETRAIN_STEPS = 150

# Role tags are single special tokens; the assistant turn is wrapped in
# {% generation %} markers so TRL's assistant_only_loss can find it.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] }}<|end|>{% endgeneration %}"
    "{% else %}{{ message['content'] }}<|end|>{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]

_WORD_TEXT = """
apple river stone cloud green light table happy music yellow window garden winter summer orange
bread candle forest silver planet rocket tiger bottle paper ocean purple dragon castle mirror pencil
butter school flower bridge turtle spring little yellow number letter morning evening friend market
basket rabbit mountain island thunder sunset coffee cookie pepper lemon melon cherry banana grape
peach plum kiwi mango olive onion carrot potato tomato salad soup pizza pasta honey sugar salt water
fire earth wind snow rain
"""
_WORDS = tuple(_WORD_TEXT.split())


def _task(rng: random.Random) -> dict[str, str]:
    kind = rng.randrange(5)
    word = rng.choice(_WORDS)
    if kind == 0:
        return {"instruction": "Reverse the letters of the word.", "input": word, "output": word[::-1]}
    if kind == 1:
        words = " ".join(rng.sample(_WORDS, 2))
        return {"instruction": "Write the words in capital letters.", "input": words, "output": words.upper()}
    if kind == 2:
        a, b = rng.randrange(50), rng.randrange(50)
        return {"instruction": "Add the two numbers.", "input": f"{a} + {b}", "output": str(a + b)}
    if kind == 3:
        return {"instruction": "Repeat the word three times.", "input": word, "output": " ".join([word] * 3)}
    return {"instruction": "Sort the letters of the word.", "input": word, "output": "".join(sorted(word))}


def make_rows(n: int = DEFAULT_ROWS, seed: int = DEFAULT_SEED) -> list[dict[str, str]]:
    """Alpaca rows {instruction, input, output}, deterministic for a seed."""
    rng = random.Random(seed)
    return [_task(rng) for _ in range(n)]


def alpaca_user_text(row: dict[str, str]) -> str:
    """How an alpaca row reads as one user turn (the worker formats rows the same way)."""
    return f"{row['instruction']}\n\n{row['input']}" if row.get("input") else row["instruction"]


def write_dataset(directory: str | Path, n: int = DEFAULT_ROWS, seed: int = DEFAULT_SEED) -> list[Path]:
    """Write the same rows in alpaca (JSON and JSONL), sharegpt, messages, prompt/completion and text form."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    rows = make_rows(n, seed)

    def messages(row: dict[str, str]) -> list[dict[str, str]]:
        return [{"role": "user", "content": alpaca_user_text(row)}, {"role": "assistant", "content": row["output"]}]

    forms: dict[str, list[dict[str, Any]]] = {
        "alpaca.jsonl": rows,
        "sharegpt.json": [
            {"conversations": [{"from": "human", "value": alpaca_user_text(r)}, {"from": "gpt", "value": r["output"]}]}
            for r in rows
        ],
        "messages.jsonl": [{"messages": messages(r)} for r in rows],
        "prompt_completion.jsonl": [{"prompt": alpaca_user_text(r) + "\n", "completion": r["output"]} for r in rows],
        "text.jsonl": [{"text": f"{alpaca_user_text(r)}\n{r['output']}"} for r in rows],
    }
    written = []
    for name, items in forms.items():
        path = out / name
        with path.open("w", encoding="utf-8") as fh:
            if name.endswith(".json"):
                json.dump(items, fh, indent=1, ensure_ascii=False)
                fh.write("\n")
            else:
                fh.writelines(json.dumps(item, ensure_ascii=False) + "\n" for item in items)
        written.append(path)
    alpaca_json = out / "alpaca.json"
    alpaca_json.write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    written.append(alpaca_json)
    return written


def _corpus(rows: list[dict[str, str]]) -> list[str]:
    return [f"{alpaca_user_text(r)}\n{r['output']}" for r in rows]


def _pretrain(model: Any, tokenizer: Any, seed: int, steps: int = PRETRAIN_STEPS, batch_size: int = 32) -> None:
    """A short language-model pre-training on plain text, so the base model is a base model.

    A randomly initialised model gives LoRA nothing to adapt (its frozen random
    output layer caps what low-rank updates can reach). These rows come from a
    different seed than the bundled dataset and carry no chat template, so
    fine-tuning still has something to teach: the chat format and the tasks.
    """
    import torch

    rows = make_rows(2000, seed + 1)
    texts = [tokenizer.bos_token + text + tokenizer.eos_token for text in _corpus(rows)]
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    labels = batch.input_ids.masked_fill(batch.attention_mask == 0, -100)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        idx = torch.randint(0, len(texts), (batch_size,), generator=generator)
        loss = model(input_ids=batch.input_ids[idx], attention_mask=batch.attention_mask[idx], labels=labels[idx]).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    model.eval()


def build_tiny_model(directory: str | Path, seed: int = DEFAULT_SEED) -> Path:
    """Train the tokenizer, initialise the Llama from `seed`, save both; returns the folder."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        _corpus(make_rows()),
        trainers.BpeTrainer(
            vocab_size=1024,
            special_tokens=SPECIAL_TOKENS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<|bos|>", eos_token="<|end|>", pad_token="<|pad|>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.model_max_length = 512

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    _pretrain(model, tokenizer, seed)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


if __name__ == "__main__":  # python -m tunestudio.worker.tiny DIR
    import sys

    print(build_tiny_model(sys.argv[1] if len(sys.argv) > 1 else "models/tiny-llama"))
