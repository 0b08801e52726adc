"""api/openai_chat.py without a server: a chat request's tool fields checked, and a worker's output read back."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from tunestudio.api.errors import ApiError
from tunestudio.api.openai_chat import ChatMessage, OutputReader, ToolRules, answer_message, template_messages
from tunestudio.inference_protocol import Started, Tools
from tunestudio.tool_calls import Hermes

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'


def reader(choice: str = "auto", parallel: bool = True, think: bool = False) -> OutputReader:
    tools = Tools([WEATHER, {"type": "function", "function": {"name": "convert"}}], choice, parallel)
    prefix = "" if choice == "auto" else Hermes().opener(None if choice == "required" else choice)
    return OutputReader(Started(1, 3, family="hermes", think=think, prefix=prefix), tools)


def read(out: OutputReader, text: str, finish: str = "stop") -> tuple[list[dict[str, Any]], Any, str]:
    deltas = out.deltas(text.removeprefix(out.stream.text))
    last, parsed, reason = out.finish(finish)
    return [*deltas, *last], parsed, reason


def test_tool_choice_none_renders_no_tools_and_a_named_one_must_be_among_them() -> None:
    assert ToolRules(tools=[WEATHER], tool_choice="none").worker_tools() is None
    assert ToolRules(tools=[WEATHER]).worker_tools() == Tools([WEATHER], "auto", True)
    named = ToolRules(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert named.worker_tools() == Tools([WEATHER], "get_weather", True)
    with pytest.raises(ValidationError, match="not among tools"):
        ToolRules(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "launch"}})
    with pytest.raises(ValidationError, match="JSON Schema of type object"):
        ToolRules(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}])


def test_turns_reach_the_template_with_arguments_as_dicts_and_tool_results_named() -> None:
    turns = template_messages([ChatMessage.model_validate(m) for m in [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "reasoning_content": "ask",
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather",
                                                                       "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "rain"}]])
    assert turns[1] == {"role": "assistant", "content": "", "reasoning_content": "ask", "thinking": "ask",
                        "tool_calls": [{"id": "c1", "type": "function", "function": {
                            "name": "get_weather", "arguments": {"city": "Oslo"}}}]}
    assert turns[2] == {"role": "tool", "content": "rain", "tool_call_id": "c1", "name": "get_weather"}
    with pytest.raises(ValueError, match="answers no call"):
        template_messages([ChatMessage(role="tool", tool_call_id="c9", content="x")])
    with pytest.raises(ValidationError, match="not JSON"):
        ChatMessage.model_validate({"role": "assistant", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]})


def test_a_call_is_read_into_tool_calls_and_reasoning_beside_content() -> None:
    deltas, parsed, reason = read(reader(think=True), f"<think>Oslo.</think>\n{CALL}")
    message = answer_message(parsed).answer()
    assert reason == "tool_calls" and message["content"] is None and message["reasoning_content"] == "Oslo."
    assert [json.loads(c["function"]["arguments"]) for c in message["tool_calls"]] == [{"city": "Oslo"}]
    assert deltas[0] == {"reasoning_content": "Oslo."}


def test_a_named_function_s_opener_settles_the_call_s_id_and_name_before_any_output() -> None:
    out = reader("get_weather")
    deltas, parsed, reason = read(out, CALL)
    first = deltas[0]["tool_calls"][0]
    assert first["function"]["name"] == "get_weather" and first["id"] == parsed.tool_calls[0].id
    assert reason == "tool_calls"


@pytest.mark.parametrize(("choice", "text"), [
    ("required", '<tool_call>\n{"name": "launch", "arguments": {}}\n</tool_call>'),  # no function of the tools
    ("get_weather", '<tool_call>\n{"name": "get_weather", "arguments": moo'),  # half-parses
    ("auto", '<tool_call>\n{"name": "get_weather", "arguments": {"city": Oslo}}\n</tool_call>'),
])
def test_no_valid_call_where_one_must_come_or_a_broken_one_is_a_422(choice: str, text: str) -> None:
    with pytest.raises(ApiError) as caught:
        read(reader(choice), text)
    assert caught.value.status == 422 and caught.value.code == "invalid_tool_call"


def test_a_call_cut_at_max_tokens_is_sent_as_it_stands_and_one_call_only_when_not_parallel() -> None:
    _, parsed, reason = read(reader("get_weather"), CALL[:60], finish="length")
    assert reason == "length" and parsed.tool_calls[0].arguments == '{"city": "Os'
    deltas, parsed, _ = read(reader(parallel=False), CALL + "\n" + CALL.replace("get_weather", "convert"))
    assert [c.name for c in parsed.tool_calls] == ["get_weather"]
    assert {p["index"] for d in deltas for p in d.get("tool_calls", [])} == {0}
    assert answer_message(read(reader(), "plain words")[1]).answer() == {"role": "assistant",
                                                                          "content": "plain words"}
