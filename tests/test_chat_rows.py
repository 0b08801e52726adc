"""Conversations with tool calls, tool results and reasoning, read from every layout into OpenAI's form
(tunestudio/chat_rows.py, issue 41 points 1 and 4)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tunestudio.chat_rows import BadTurn, read_tools, read_turns, tools_of, unknown_calls

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "today's weather",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}


def call(name: str, arguments: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}


# The same two-round conversation with two parallel calls, as each layout writes it.
EXPECTED = [
    {"role": "user", "content": "Paris or Rome?"},
    {"role": "assistant", "content": "",
     "tool_calls": [call("get_weather", {"city": "Paris"}, "A"), call("get_weather", {"city": "Rome"}, "B")]},
    {"role": "tool", "tool_call_id": "A", "name": "get_weather", "content": "rain"},
    {"role": "tool", "tool_call_id": "B", "name": "get_weather", "content": "sun"},
    {"role": "assistant", "content": "Rome.", "reasoning_content": "Sun beats rain."},
]
OPENAI = [
    {"role": "user", "content": "Paris or Rome?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "A", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "B", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
    {"role": "tool", "tool_call_id": "A", "content": "rain"},
    {"role": "tool", "tool_call_id": "B", "content": "sun"},
    {"role": "assistant", "content": "Rome.", "reasoning_content": "Sun beats rain."},
]
HERMES = [
    {"from": "human", "value": "Paris or Rome?"},
    {"from": "gpt", "value": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
                             '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'},
    {"from": "tool", "value": "<tool_response>\nrain\n</tool_response>\n<tool_response>\nsun\n</tool_response>"},
    {"from": "gpt", "value": "<think>Sun beats rain.</think>\nRome."},
]
SHAREGPT = [
    {"from": "human", "value": "Paris or Rome?"},
    {"from": "function_call", "value": json.dumps([{"name": "get_weather", "arguments": {"city": "Paris"}},
                                                   {"name": "get_weather", "arguments": {"city": "Rome"}}])},
    {"from": "observation", "value": "rain"},
    {"from": "observation", "value": "sun"},
    {"from": "gpt", "value": "Rome.", "thinking": "Sun beats rain."},
]
OLDER = [  # OpenAI's older function_call / function role: one call at a time, answered by name
    {"role": "user", "content": "Paris?"},
    {"role": "assistant", "content": None, "function_call": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
    {"role": "function", "name": "get_weather", "content": "rain"},
    {"role": "assistant", "content": "Rain."},
]


def _ids_made_up(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The expected conversation with the ids a row without ids gets (call_TTTKK: turn, call)."""
    out = json.loads(json.dumps(messages))
    out[1]["tool_calls"][0]["id"], out[1]["tool_calls"][1]["id"] = "call00201", "call00202"
    out[2]["tool_call_id"], out[3]["tool_call_id"] = "call00201", "call00202"
    return out


@pytest.mark.parametrize(("layout", "turns"), [("openai", OPENAI), ("hermes", HERMES), ("sharegpt", SHAREGPT)])
def test_every_layout_reads_into_openais_form(layout: str, turns: list[dict[str, Any]]) -> None:
    expected = EXPECTED if layout == "openai" else _ids_made_up(EXPECTED)
    assert read_turns(turns, "messages") == expected


def test_the_older_function_call_and_function_role() -> None:
    messages = read_turns(OLDER, "messages")
    assert messages[1]["tool_calls"] == [call("get_weather", {"city": "Paris"}, "call00201")]
    assert messages[2] == {"role": "tool", "tool_call_id": "call00201", "name": "get_weather", "content": "rain"}


def test_tools_and_the_older_functions_and_tools_as_json_text() -> None:
    bare = WEATHER["function"]
    assert tools_of({"tools": [WEATHER]}) == [WEATHER]
    assert tools_of({"functions": [bare]}) == [WEATHER]
    assert tools_of({"tools": json.dumps([bare])}) == [WEATHER]
    assert tools_of({"messages": []}) is None


def test_weight_zero_is_kept_and_other_weights_refused() -> None:
    turns = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "weight": 0}]
    assert read_turns(turns, "messages")[1] == {"role": "assistant", "content": "a", "weight": 0}
    with pytest.raises(BadTurn, match=r"turn 2 of 'messages' has weight 0.5; weight is 0 \(not trained on\) or 1"):
        read_turns([turns[0], {**turns[1], "weight": 0.5}], "messages")


def _with(turn: int, **change: Any) -> list[dict[str, Any]]:
    turns = json.loads(json.dumps(OPENAI))
    turns[turn - 1].update(change)
    return turns


@pytest.mark.parametrize(("turns", "error"), [
    (_with(2, tool_calls=[{"id": "A", "type": "function",
                           "function": {"name": "get_weather", "arguments": '{"city": Paris}'}}]),
     r"turn 2 of 'messages': call 1 \('get_weather'\) has arguments that are not JSON \(Expecting value at "
     r"column 10\)"),
    (_with(2, tool_calls=[{"id": "A", "function": {"name": "get_weather", "arguments": "[1]"}}]),
     r"call 1 \('get_weather'\) has arguments that are a JSON list, not an object"),
    (_with(3, tool_call_id="Z"), r"turn 3 of 'messages' has tool_call_id 'Z', which no earlier unanswered assistant"),
    ([OPENAI[0], {"role": "tool", "content": "rain"}], r"turn 2 of 'messages' is a tool result, but no assistant call"),
    ([*OPENAI[:4], {"role": "assistant", "content": "<think>never closed"}],
     r"turn 5 of 'messages' opens <think> without closing it"),
    ([OPENAI[0], {"from": "gpt", "value": '<tool_call>{"name": "f"}'}], r"<tool_call> that is not closed"),
    ([OPENAI[0], {"from": "gpt", "value": "<tool_call>{name: f}</tool_call>"}], r"<tool_call> that is not JSON"),
    ([{"role": "oracle", "content": "x"}], r"turn 1 of 'messages' needs role/content text: unknown role 'oracle'"),
])
def test_a_bad_turn_is_named_with_what_is_wrong(turns: list[dict[str, Any]], error: str) -> None:
    with pytest.raises(BadTurn, match=error):
        read_turns(turns, "messages")


@pytest.mark.parametrize(("tools", "error"), [
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}],
     r"tool 1 of 'tools' \('f'\): its 'parameters' has type 'string'; a function's parameters are a schema of type"),
    ([{"type": "function", "function": {"name": "f", "parameters": "city"}}], r"is a str, not a JSON Schema object"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "required": "city"}}}],
     r"has 'required' that is not a list of names"),
    ([{"type": "function", "function": {"description": "no name"}}], r"tool 1 of 'tools' has no 'name'"),
    ("[{not json", r"field 'tools' is text that is not JSON"),
])
def test_tools_that_are_not_json_schema_are_refused(tools: Any, error: str) -> None:
    with pytest.raises(BadTurn, match=error):
        read_tools(tools)


def test_calls_to_functions_the_row_does_not_declare_are_found() -> None:
    messages = read_turns(OPENAI, "messages")
    assert unknown_calls(messages, [WEATHER]) == []
    other = {"type": "function", "function": {"name": "convert"}}
    assert unknown_calls(messages, [other]) == ["get_weather", "get_weather"]
    assert unknown_calls(messages, None) == []  # tools described in the text: nothing to check against
