"""Outputs read as they stream: OpenAI's deltas, which always add up to the whole output's reading."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tunestudio.tool_calls import CallStream, Family, Harmony, Hermes, Llama3, Mistral, parse, split_think

NAMES = {"get_weather", "convert"}
OUTPUTS: list[tuple[Family | None, bool, str]] = [
    (Hermes(), False, 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
                      '</tool_call>\n<tool_call>\n{"name": "convert", "arguments": {"amount": 3}}\n</tool_call>'),
    (Hermes(), True, '<think>\nThe user wants weather.\n</think>\n\n<tool_call>\n{"arguments": {"city": "Oslo"}, '
                     '"name": "get_weather"}\n</tool_call>'),
    (Hermes(), False, "No call: <tool_call> is just a word here, and {braces} too.\n\n"),
    (Hermes(), False, '<tool_call>\n{"name": "get_weather", "arguments": {"city": Paris}}\n</tool_call>'),
    (Llama3(), False, '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Rome"}}'),
    (Llama3(), False, "It is sunny in {city}."),
    (Mistral(), False, '[TOOL_CALLS][{"name": "convert", "arguments": {"amount": 2, "to": "USD"}}]'),
    (Mistral(args_layout=True), False, 'ok[TOOL_CALLS]get_weather[ARGS]{"city": "Lima"}'),
    (Harmony(), False, '<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>commentary '
                       'to=functions.get_weather <|constrain|>json<|message|>{"city": "Kyiv"}<|call|>'),
    (None, True, "<think>a</think>plain answer"),
]


def streamed(family: Family | None, think: bool, text: str, step: int) -> tuple[dict[str, Any], Any]:
    """The deltas of a stream fed `step` characters at a time, added up as an OpenAI client adds them up."""
    stream = CallStream(family, NAMES, think)
    deltas = [d for i in range(0, len(text), step) for d in stream.feed(text[i:i + step])]
    last, parsed = stream.finish()
    total: dict[str, Any] = {"content": "", "reasoning_content": "", "calls": []}
    for delta in [*deltas, *last]:
        for key in ("content", "reasoning_content"):
            total[key] += delta.get(key, "")
        for piece in delta.get("tool_calls", []):
            if piece["index"] == len(total["calls"]):
                assert set(piece) == {"index", "id", "type", "function"} and piece["function"]["name"]
                total["calls"].append({"id": piece["id"], "name": piece["function"]["name"], "arguments": ""})
            else:
                assert set(piece) == {"index", "function"} and set(piece["function"]) == {"arguments"}
            total["calls"][piece["index"]]["arguments"] += piece["function"]["arguments"]
    return total, parsed


@pytest.mark.parametrize(("family", "think", "text"), OUTPUTS)
@pytest.mark.parametrize("step", [1, 3, 1000])
def test_the_deltas_add_up_to_the_whole_reading_whatever_the_pieces(family: Family | None, think: bool, text: str,
                                                                    step: int) -> None:
    total, parsed = streamed(family, think, text, step)
    whole = parse(text, family, NAMES, think)
    assert total["content"] == (whole.content or "") and total["reasoning_content"] == (whole.reasoning or "")
    assert [(c["name"], c["arguments"]) for c in total["calls"]] == [(c.name, c.arguments) for c in
                                                                      whole.tool_calls]
    assert [c["id"] for c in total["calls"]] == [c.id for c in parsed.tool_calls]
    assert parsed.error == whole.error


def test_arguments_arrive_in_pieces_before_the_call_ends() -> None:
    stream = CallStream(Hermes(), NAMES)
    first = stream.feed('<tool_call>\n{"name": "get_weather", "arguments": {"ci')
    assert first[0]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"ci'}
    assert stream.feed('ty": "Paris"}}\n</tool_call>') == [{"tool_calls": [{"index": 0, "function": {
        "arguments": 'ty": "Paris"}'}}]}]
    assert json.loads(stream.finish()[1].tool_calls[0].arguments) == {"city": "Paris"}


def test_nothing_is_sent_while_a_marker_or_a_name_is_half_written() -> None:
    stream = CallStream(Hermes(), NAMES)
    assert stream.feed("Hi <tool_c") == [{"content": "Hi"}]  # the blank waits for what follows it
    assert stream.feed('all>\n{"name": "get_wea') == []
    assert stream.feed('ther", ')[0]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_a_broken_call_is_reported_at_the_end() -> None:
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'
    assert streamed(Hermes(), False, text, 4)[1].error == "the model's call to get_weather ends before its " \
                                                         "arguments do"


def test_think_is_split_when_open_at_the_start_or_when_the_prompt_opened_it() -> None:
    assert split_think("<think>a</think>b", final=True) == ("a", len("<think>a</think>"))
    assert split_think("a</think>b", final=True, open_at_start=True) == ("a", len("a</think>"))
    assert split_think("<thi", final=False) == (None, None)
    assert split_think("<think>abc</th", final=False) == ("abc", None)
    assert split_think("no thinking", final=True) == (None, 0)
    assert parse("r</think>\nanswer", None, think=True, think_open=True).reasoning == "r"
