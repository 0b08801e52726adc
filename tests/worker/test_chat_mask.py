"""The per-turn loss mask without {% generation %} markers (worker/data/chat_mask.py, issue 41 points 2 and 3),
checked token by token against three real chat templates (Qwen2.5-Instruct, Llama-3.1-Instruct, Qwen3: their
files in tests/worker/templates/, as TRL ships them) put on the tiny model's tokenizer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tunestudio.chat_rows import read_turns
from tunestudio.worker import data
from tunestudio.worker.data.chat_mask import Renderer, renderer_for
from tunestudio.worker.errors import UserError

from ..helpers.templates import PLAIN_CHAT_TEMPLATE
from .test_data import cfg_for, write_jsonl

TEMPLATES = Path(__file__).parent / "templates"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "today's weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
TURNS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "A", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "A", "content": "RAIN-RESULT"},
    {"role": "assistant", "content": "<think>It rains, so say so.</think>It rains."},
    {"role": "user", "content": "Thanks"},
    {"role": "assistant", "content": "Welcome.", "weight": 0},
]
EXAMPLE = {"messages": read_turns(TURNS, "messages"), "tools": TOOLS}
CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


@pytest.fixture(scope="module")
def tokenizers(tiny_model: Path) -> dict[str, Any]:
    from transformers import AutoTokenizer

    out = {}
    for name in ("qwen2_5", "llama3_1", "qwen3"):
        tok = AutoTokenizer.from_pretrained(str(tiny_model))
        tok.chat_template = (TEMPLATES / f"{name}.jinja").read_text()
        out[name] = tok
    return out


def trained(tok: Any, row: dict[str, list[int]]) -> list[str]:
    """The trained stretches of a row, decoded, in order: token by token, each stretch of mask 1."""
    out, run = [], []
    for token, bit in zip(row["input_ids"], row["assistant_masks"], strict=True):
        if bit:
            run.append(token)
        elif run:
            out.append(tok.decode(run))
            run = []
    return out + ([tok.decode(run)] if run else [])


# What each template trains of EXAMPLE, reasoning kept: the calls, the replies and the end-of-turn token; never
# the system, user, tool result or the tools' schema; not the weight-0 turn.
KEPT = {
    "qwen2_5": [[f"<tool_call>\n{CALL}\n</tool_call><|im_end|>\n",
                 "<think>\nIt rains, so say so.\n</think>\n\nIt rains.<|im_end|>\n"]],
    "llama3_1": [['{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>',
                  "<think>\nIt rains, so say so.\n</think>\n\nIt rains.<|eot_id|>"]],
    # Qwen3 writes <think></think> in the last turn only and drops the reasoning of rounds before the last user
    # message: each turn is trained in a row that ends with it, as the model writes it
    "qwen3": [["<think>\nIt rains, so say so.\n</think>\n\nIt rains.<|im_end|>\n"],
              [f"<think>\n\n</think>\n\n<tool_call>\n{CALL}\n</tool_call><|im_end|>\n"]],
}


@pytest.mark.parametrize("name", list(KEPT))
def test_each_assistant_turn_is_trained_token_by_token(name: str, tokenizers: dict[str, Any]) -> None:
    tok = tokenizers[name]
    rows = renderer_for(tok, "keep", assistant_only=True).rows(EXAMPLE)
    assert [trained(tok, r) for r in rows] == KEPT[name]
    # each row is the template's own text of the conversation up to a turn (all of it, or up to the turn it
    # trains: Qwen3), tokenised as apply_chat_template tokenises it
    forms = [Renderer(tok, "keep", native_reasoning=name == "qwen3")._form(m) for m in EXAMPLE["messages"]]
    ends = [5, 3] if name == "qwen3" else [7]
    for row, end in zip(rows, ends, strict=True):
        assert row["input_ids"] == tok.apply_chat_template(forms[:end], tools=TOOLS, tokenize=True,
                                                           return_dict=True)["input_ids"]
    whole = rows[0]
    untrained = tok.decode([t for t, b in zip(whole["input_ids"], whole["assistant_masks"], strict=True) if not b])
    for text in ("Be brief.", "Weather in Paris?", "RAIN-RESULT", "today's weather in a city"):
        assert text in untrained
    if name != "qwen3":
        assert "Thanks" in untrained and "Welcome." in untrained  # a user turn; the weight-0 turn


@pytest.mark.parametrize("name", list(KEPT))
def test_reasoning_mask_keeps_it_in_context_without_loss(name: str, tokenizers: dict[str, Any]) -> None:
    tok = tokenizers[name]
    rows = renderer_for(tok, "mask", assistant_only=True).rows(EXAMPLE)
    replies = [s for r in rows for s in trained(tok, r)]
    end = {"llama3_1": "<|eot_id|>"}.get(name, "<|im_end|>\n")
    assert "<think>\n" in replies and f"\n</think>\n\nIt rains.{end}" in replies  # the markers are trained
    assert not any("It rains, so say so" in s for s in replies)
    assert any("It rains, so say so" in tok.decode(r["input_ids"]) for r in rows)  # ... and in context
    dropped = renderer_for(tok, "drop", assistant_only=True).rows(EXAMPLE)
    assert not any("It rains, so say so" in tok.decode(r["input_ids"]) for r in dropped)


def test_reasoning_auto_is_what_the_template_does(tokenizers: dict[str, Any]) -> None:
    assert renderer_for(tokenizers["qwen3"], "auto", True).reasoning == "keep"  # Qwen3 renders reasoning_content
    qwen25 = renderer_for(tokenizers["qwen2_5"], "auto", True)
    assert qwen25.reasoning == "drop"  # Qwen2.5 ignores it: said in a note
    assert "does not render reasoning, so the reasoning of 1 assistant turn(s) is dropped" in qwen25.check([EXAMPLE])[0]


def test_a_template_that_cannot_render_tools_is_refused_naming_it(tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    tok.chat_template = PLAIN_CHAT_TEMPLATE  # a template that knows no tools
    with pytest.raises(UserError, match=r"the chat template of .*tiny-llama cannot render tools \(it renders the same "
                                        r"text with and without them\)"):
        renderer_for(tok, "auto", True).check([EXAMPLE])


def test_llama31_refuses_parallel_calls_with_its_own_reason(tokenizers: dict[str, Any]) -> None:
    two = json.loads(json.dumps(EXAMPLE))
    two["messages"][2]["tool_calls"].append({**two["messages"][2]["tool_calls"][0], "id": "B"})
    two["messages"].insert(4, {"role": "tool", "tool_call_id": "B", "name": "get_weather", "content": "sun"})
    with pytest.raises(data.RowProblem, match=r"cannot be rendered by the chat template of .*: This model only "
                                              r"supports single tool-calls at once!"):
        renderer_for(tokenizers["llama3_1"], "keep", True).rows(two)
    assert trained(tokenizers["qwen2_5"], renderer_for(tokenizers["qwen2_5"], "drop", True).rows(two)[0])[0] == (
        f"<tool_call>\n{CALL}\n</tool_call>\n<tool_call>\n{CALL}\n</tool_call><|im_end|>\n")


def test_tool_rows_through_prepare_are_not_mangled_by_arrow(tokenizers: dict[str, Any], tmp_path: Path) -> None:
    # Arrow unifies nested dicts across rows (missing keys become None, rendered as null) and templates tojson
    # the arguments: rows of different shapes must reach the trainer exactly as the template renders each one.
    other = {"messages": [{"role": "user", "content": "Convert 3 EUR"}, {"role": "assistant", "content": "",
                                                                          "tool_calls": [
        {"id": "C", "type": "function", "function": {"name": "convert", "arguments": '{"amount": 3, "to": "USD"}'}}]},
        {"role": "tool", "tool_call_id": "C", "content": "3.2"}, {"role": "assistant", "content": "3.2 USD"}],
        "tools": [{"type": "function", "function": {"name": "convert", "parameters": {"type": "object"}}}]}
    plain = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}
    tok = tokenizers["qwen2_5"]
    path = write_jsonl(tmp_path / "tools.jsonl", [{"messages": TURNS, "tools": TOOLS}, other, plain])
    prepared = data.prepare(cfg_for(path, max_seq_length=4096, reasoning="drop"), tok)
    assert prepared.train.column_names == ["input_ids", "assistant_masks"] and prepared.dropped == 0
    texts = [tok.decode(r["input_ids"]) for r in prepared.train]
    assert '"arguments": {"amount": 3, "to": "USD"}' in texts[1] and "null" not in "".join(texts)
    assert "None" not in "".join(texts)
    assert '"name": "convert", "parameters": {"type": "object"}' in texts[1]
    # without train_on_completions a plain row is trained whole, as before; a row with tools or weights is
    # trained on its assistant turns all the same (a tool result is never the model's to write)
    assert trained(tok, prepared.train[2]) == [texts[2]]
    assert "RAIN-RESULT" not in "".join(trained(tok, prepared.train[0]))
    assert trained(tok, prepared.train[1]) == [
        '<tool_call>\n{"name": "convert", "arguments": {"amount": 3, "to": "USD"}}\n</tool_call><|im_end|>\n',
        "3.2 USD<|im_end|>\n"]


def test_calls_to_undeclared_functions_are_dropped_naming_the_row(tokenizers: dict[str, Any],
                                                                  tmp_path: Path) -> None:
    wrong = {"messages": TURNS, "tools": [{"type": "function", "function": {"name": "convert"}}]}
    path = write_jsonl(tmp_path / "t.jsonl", [{"messages": TURNS, "tools": TOOLS}] * 3 + [wrong])
    prepared = data.prepare(cfg_for(path, max_seq_length=4096), tokenizers["qwen2_5"])
    assert prepared.dropped == 1
    assert f"dataset {path} row 4 calls 'get_weather', which its 'tools' do not declare" in prepared.warnings[0]


# --- DPO on tool-call preference pairs (point 7) ----------------------------------------------------------------
def test_dpo_pairs_with_tool_calls_reach_trl_as_the_template_renders_them(tiny_model: Path, tmp_path: Path,
                                                                          tokenizers: dict[str, Any]) -> None:
    # Before issue 41 the pair was dropped ("unknown role"); through Arrow, Qwen2.5's template would have written
    # the arguments as a quoted string.
    from .test_data import _trainer

    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "A", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
    pair = {"prompt": [{"role": "user", "content": "Weather in Paris?"}], "chosen": [call],
            "rejected": [{"role": "assistant", "content": "I cannot know."}], "tools": TOOLS}
    plain = {"prompt": "Say hi.", "chosen": "hi", "rejected": "no"}
    trainer, tok, _ = _trainer(tiny_model, tmp_path, [pair, plain], tokenizers["qwen2_5"], method="dpo",
                               max_seq_length=4096)
    first = trainer.train_dataset[0]
    assert tok.decode(first["prompt_ids"]).endswith("Weather in Paris?<|im_end|>\n<|im_start|>assistant\n")
    assert '"name": "get_weather"' in tok.decode(first["prompt_ids"])  # the tools' schema, in the prompt
    assert tok.decode(first["chosen_ids"]) == f"<tool_call>\n{CALL}\n</tool_call><|im_end|>\n{tok.eos_token}"
    assert tok.decode(first["rejected_ids"]) == f"I cannot know.<|im_end|>\n{tok.eos_token}"
    second = trainer.train_dataset[1]  # the plain pair takes the same shape, through the template too
    assert tok.decode(second["chosen_ids"]) == f"hi<|im_end|>\n{tok.eos_token}"


def test_the_mask_reaches_trls_labels_and_the_collator(tiny_model: Path, tmp_path: Path,
                                                       tokenizers: dict[str, Any]) -> None:
    # SFTTrainer takes the rows as tokenised (it renders nothing again) and turns assistant_masks into labels
    from .test_data import _trainer

    tok = tokenizers["qwen2_5"]
    trainer, _, _ = _trainer(tiny_model, tmp_path, [{"messages": TURNS, "tools": TOOLS}] * 2, tok,
                             max_seq_length=4096, reasoning="drop")
    expected = renderer_for(tok, "drop", True).rows(EXAMPLE)[0]
    row = trainer.train_dataset[0]
    assert row["input_ids"] == expected["input_ids"]
    assert row["labels"] == [t if m else -100 for t, m in zip(expected["input_ids"], expected["assistant_masks"],
                                                                strict=True)]
    batch = trainer.data_collator([trainer.train_dataset[0], trainer.train_dataset[1]])
    assert batch["labels"][0].tolist()[: len(row["labels"])] == row["labels"]
    assert tok.decode([t for t in row["labels"] if t != -100]) == (
        f"<tool_call>\n{CALL}\n</tool_call><|im_end|>\nIt rains.<|im_end|>\n")
