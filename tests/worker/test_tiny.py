from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

from tunestudio.worker.tiny import CHAT_TEMPLATE, make_rows, write_dataset

from ..helpers.templates import PLAIN_CHAT_TEMPLATE  # the template before tools and reasoning existed


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


def _bundled_conversations() -> list[list[dict[str, str]]]:
    bundled = Path(__file__).resolve().parents[2] / "examples" / "data"

    def lines(name: str) -> list[dict]:
        return [json.loads(line) for line in (bundled / name).read_text().splitlines()]

    roles = {"human": "user", "gpt": "assistant"}
    conversations = [row["messages"] for row in lines("messages.jsonl")]
    conversations += [[{"role": roles[t["from"]], "content": t["value"]} for t in row["conversations"]]
                      for row in json.loads((bundled / "sharegpt.json").read_text())]
    conversations += [row["prompt"] + row["chosen"] for row in lines("preference.jsonl")]
    conversations += [[{"role": "system", "content": "Answer in one word."}, *c] for c in conversations[:20]]
    return conversations


def test_a_conversation_without_tools_renders_as_before(tiny_model: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    conversations = _bundled_conversations()
    assert len(conversations) > 1000
    for messages in conversations:
        for prompt in (messages[:-1], messages):
            for generation_prompt in (True, False):
                old, new = (tokenizer.apply_chat_template(prompt, chat_template=template, tokenize=False,
                                                          add_generation_prompt=generation_prompt)
                            for template in (PLAIN_CHAT_TEMPLATE, CHAT_TEMPLATE))
                assert new == old


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def test_the_template_renders_tools_calls_results_and_thinking_as_qwen_does(tiny_model: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?\n\nParis"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"sky": "sunny"}'},
        {"role": "tool", "tool_call_id": "c2", "content": '{"sky": "rainy"}'},
        {"role": "assistant", "content": "sunny", "reasoning_content": "The tool said so."},
    ]
    rendered = tokenizer.apply_chat_template(messages, tools=[WEATHER], chat_template=CHAT_TEMPLATE, tokenize=False)
    assert rendered == (
        "<|bos|><|system|>Be brief.\n\n# Tools\n\n<tools>\n" + json.dumps(WEATHER) + "\n</tools><|end|>"
        "<|user|>Weather?\n\nParis<|end|>"
        '<|assistant|><tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call><|end|>'
        '<|user|><tool_response>\n{"sky": "sunny"}\n</tool_response>\n'
        '<tool_response>\n{"sky": "rainy"}\n</tool_response><|end|>'
        "<|assistant|><think>\nThe tool said so.\n</think>\n\nsunny<|end|>"
    )
    # the loss mask ({% generation %}) covers both assistant turns whole, calls and thinking included, nothing else
    out = tokenizer.apply_chat_template(messages, tools=[WEATHER], chat_template=CHAT_TEMPLATE, return_dict=True,
                                        return_assistant_tokens_mask=True)
    trained = tokenizer.decode([t for t, m in zip(out["input_ids"], out["assistant_masks"], strict=True) if m])
    assert trained == (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call><|end|>'
        "<think>\nThe tool said so.\n</think>\n\nsunny<|end|>"
    )
    # tools without a system turn open one; the generation prompt is unchanged
    alone = tokenizer.apply_chat_template(messages[1:2], tools=[WEATHER], chat_template=CHAT_TEMPLATE,
                                          tokenize=False, add_generation_prompt=True)
    assert alone == ("<|bos|><|system|># Tools\n\n<tools>\n" + json.dumps(WEATHER) + "\n</tools><|end|>"
                     "<|user|>Weather?\n\nParis<|end|><|assistant|>")
