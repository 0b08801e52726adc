"""api/fine_tune_data.py: OpenAI's fine-tuning JSONL read line by line, each refusal naming the line."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from tunestudio.api.fine_tune_data import BadFile, check, convert

CHAT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
PAIR = {"input": {"messages": [{"role": "user", "content": "hi"}]},
        "preferred_output": [{"role": "assistant", "content": "hello"}],
        "non_preferred_output": [{"role": "assistant", "content": "go away"}]}


def data(*rows: Any) -> io.BytesIO:
    return io.BytesIO("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows).encode())


def with_message(message: dict[str, Any]) -> dict[str, Any]:
    return {"messages": [message, {"role": "assistant", "content": "ok"}]}


def test_kinds_and_rows_are_counted_blank_lines_skipped() -> None:
    assert (check(data(CHAT, "", CHAT)).kind, check(data(CHAT, "", CHAT)).rows) == ("chat", 2)
    assert check(data(PAIR)).kind == "preference"


@pytest.mark.parametrize(("row", "words"), [
    ("[1, 2]", "line 2: is a JSON list, not an object"),
    (with_message({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}),
     "content part of type 'image_url'"),
    (with_message({"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}),
     "message 1 of 'messages': call 1 has no function name"),
    (with_message({"role": "narrator", "content": "x"}), "has role 'narrator'"),
    ({**CHAT, "tools": [{"type": "function"}]}, "tool 1 of 'tools' has no 'name'"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", "weight": 0}]},
     "every one has weight 0"),
    ({"messages": []}, "'messages' must be a non-empty list"),
    ({"input": {"messages": [{"role": "user", "content": "x"}]}, "preferred_output": []},
     "has no 'non_preferred_output'"),
], ids=["not-an-object", "image", "tool-call", "role", "tools", "weight-0", "empty", "pair-missing"])
def test_a_bad_row_is_refused_naming_its_line(row: Any, words: str) -> None:
    first = PAIR if isinstance(row, dict) and "input" in row else CHAT
    with pytest.raises(BadFile) as refused:
        check(data(first, row))
    assert words in str(refused.value) and refused.value.line == 2


def test_a_preference_output_must_be_the_assistants() -> None:
    row = {**PAIR, "preferred_output": [{"role": "user", "content": "x"}]}
    with pytest.raises(BadFile, match="line 1: message 1 of 'preferred_output' has role 'user'"):
        check(data(row))


def test_not_utf8_and_no_rows() -> None:
    with pytest.raises(BadFile, match="line 1: is not UTF-8"):
        check(io.BytesIO(b"\xff\xfe{}\n"))
    with pytest.raises(BadFile, match="no rows"):
        check(io.BytesIO(b"\n\n"))


def test_convert_writes_the_studios_formats() -> None:
    out = io.BytesIO()
    chat = {"messages": [{"role": "developer", "content": "be brief", "name": "x"},
                         {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                         {"role": "assistant", "content": "c", "weight": 1}]}
    assert convert(data(chat), out, "chat") == 1
    assert json.loads(out.getvalue()) == {"messages": [{"role": "system", "content": "be brief"},
                                                       {"role": "user", "content": "ab"},
                                                       {"role": "assistant", "content": "c"}]}
    out = io.BytesIO()
    convert(data(PAIR), out, "preference")
    assert json.loads(out.getvalue()) == {"prompt": PAIR["input"]["messages"], "chosen": PAIR["preferred_output"],
                                          "rejected": PAIR["non_preferred_output"]}
    with pytest.raises(BadFile, match="line 1: is a chat row, but this job needs preference rows"):
        convert(data(CHAT), io.BytesIO(), "preference")


# --- tool calls, as OpenAI's fine-tuning takes them (issue 41, point 6) ---------------------------------------
CITY = {"type": "object", "properties": {"city": {"type": "string"}}}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "the weather", "parameters": CITY}}
TOOL_CHAT = {"messages": [
    {"role": "user", "content": "Paris?"},
    {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function",
                                          "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "rain"},
    {"role": "assistant", "content": "Rain.", "weight": 1},
    {"role": "user", "content": "And?"},
    {"role": "assistant", "content": "Nothing more.", "weight": 0}], "tools": [WEATHER], "parallel_tool_calls": False}


def test_tool_calling_rows_and_weights_are_taken_as_openai_takes_them() -> None:
    # Before issue 41: 400 "tunestudio trains on text turns only (no tool calls yet)", and weight 0 refused.
    assert check(data(TOOL_CHAT, CHAT)).rows == 2
    out = io.BytesIO()
    convert(data(TOOL_CHAT), out, "chat")
    row = json.loads(out.getvalue())
    assert row["tools"] == [WEATHER]
    assert row["messages"][1] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
    assert row["messages"][2] == {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "rain"}
    assert row["messages"][5]["weight"] == 0 and "weight" not in row["messages"][3]
    pair = {"input": {"messages": TOOL_CHAT["messages"][:1], "tools": [WEATHER]},
            "preferred_output": TOOL_CHAT["messages"][1:2],
            "non_preferred_output": [{"role": "assistant", "content": "I cannot know."}]}
    out = io.BytesIO()
    convert(data(pair), out, "preference")
    assert json.loads(out.getvalue())["tools"] == [WEATHER]


def _tool_chat(**change: Any) -> dict[str, Any]:
    row = json.loads(json.dumps(TOOL_CHAT))
    for turn, fields in change.items():
        row["messages"][int(turn[1:]) - 1].update(fields)
    return row


@pytest.mark.parametrize(("row", "words"), [
    (_tool_chat(m2={"tool_calls": [{"id": "call_1", "type": "function",
                                    "function": {"name": "get_weather", "arguments": "{city: Paris}"}}]}),
     "message 2 of 'messages': call 1 ('get_weather') has arguments that are not JSON"),
    (_tool_chat(m3={"tool_call_id": "call_9"}), "message 3 of 'messages' has tool_call_id 'call_9', which no earlier"),
    ({**TOOL_CHAT, "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "x"}}}]},
     "tool 1 of 'tools' ('get_weather'): its 'parameters' has type 'x'"),
    ({**TOOL_CHAT, "tools": [{"type": "function", "function": {"name": "convert"}}]},
     "calls 'get_weather', which its 'tools' do not declare"),
], ids=["arguments", "call-id", "schema", "undeclared"])
def test_a_bad_tool_row_is_refused_naming_its_line(row: Any, words: str) -> None:
    with pytest.raises(BadFile) as refused:
        check(data(CHAT, row))
    assert words in str(refused.value) and refused.value.line == 2
