from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

from tunestudio.worker.tiny import make_rows, write_dataset


def test_tiny_model_loads_through_from_pretrained(tiny_model: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    assert model.config.model_type == "llama"
    assert sum(p.numel() for p in model.parameters()) < 2_000_000
    assert "{% generation %}" in tokenizer.chat_template
    text = "Reverse the letters of the word.\n\nünïcödé 🙂"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text  # byte-level: nothing is unknown
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], tokenize=False
    )
    assert rendered == "<|bos|><|user|>hi<|end|><|assistant|>yo<|end|>"


def test_bundled_dataset_is_what_the_generator_writes(tmp_path: Path) -> None:
    write_dataset(tmp_path)
    bundled = Path(__file__).resolve().parents[2] / "examples" / "data"
    for path in sorted(tmp_path.iterdir()):
        assert path.read_bytes() == (bundled / path.name).read_bytes(), path.name
    rows = [json.loads(line) for line in (bundled / "alpaca.jsonl").read_text().splitlines()]
    assert rows == make_rows() and len(rows) >= 300
    assert {r["instruction"] for r in rows} == {"Write the opposite of the word.", "What colour is it?",
                                                "What sound does this animal make?", "Translate the word into French.",
                                                "What number comes next?"}
