"""Scoring calls of held-out rows, on literal outputs (worker/train/tool_scores.py)."""

from __future__ import annotations

import pytest

from tunestudio.worker.tiny import CHAT_TEMPLATE
from tunestudio.worker.train.tool_scores import Call, NotJSON, calls_of, mean_scores, reader_for, score_calls

WEATHER_PARIS = Call("get_weather", {"city": "Paris"})
CONVERT = Call("convert", {"amount": 5, "from": "EUR", "to": "USD"})


def test_a_reference_turns_calls_in_openai_form() -> None:
    turn = {"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "c2", "type": "function", "function": {"name": "convert",
                                                      "arguments": {"amount": 5, "from": "EUR", "to": "USD"}}}]}
    assert calls_of(turn) == [WEATHER_PARIS, CONVERT]  # arguments as a JSON text or as the object itself
    assert calls_of({"role": "assistant", "function_call": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}) \
        == [WEATHER_PARIS]
    assert calls_of({"role": "assistant", "content": "moo"}) == []


def test_an_output_read_into_calls_by_its_templates_parser() -> None:
    read = reader_for(CHAT_TEMPLATE)  # the tiny model's: Hermes/Qwen <tool_call> JSON, <think> first
    assert read('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>') == [WEATHER_PARIS]
    two = ('<think>\nweather first\n</think>\n\n<tool_call>\n{"arguments": {"city": "Paris"}, "name": "get_weather"}'
           '\n</tool_call>\n<tool_call>\n{"name": "convert", "arguments": {"to": "USD", "from": "EUR", "amount": 5}}')
    assert read(two) == [WEATHER_PARIS, CONVERT]  # any key order; the last block cut at the end of output
    assert read("moo") == []
    broken = read('<tool_call>\n{"name": "get_weather", "arguments": {"city": </tool_call>')
    assert len(broken) == 1 and broken[0].name == "get_weather" and isinstance(broken[0].arguments, NotJSON)
    assert reader_for("{{ messages }}")('<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>') == []


def test_one_call_scored() -> None:
    right = score_calls([WEATHER_PARIS], [WEATHER_PARIS])
    assert right == {"tool_choice": 1.0, "tool_name": 1.0, "tool_args": 1.0, "tool_arg_match": 1.0}
    # the right function, one of three arguments wrong
    wrong_to = Call("convert", {"amount": 5, "from": "EUR", "to": "GBP"})
    assert score_calls([wrong_to], [CONVERT]) == {"tool_choice": 1.0, "tool_name": 1.0, "tool_args": 0.0,
                                                  "tool_arg_match": pytest.approx(2 / 3)}
    # 5 and "5" differ; an extra argument counts against the share
    as_text = Call("convert", {"amount": "5", "from": "EUR", "to": "USD", "note": "x"})
    assert score_calls([as_text], [CONVERT])["tool_arg_match"] == pytest.approx(2 / 4)
    # the wrong function
    assert score_calls([Call("get_weather", {"city": "Rome"})], [CONVERT]) == {
        "tool_choice": 1.0, "tool_name": 0.0, "tool_args": 0.0, "tool_arg_match": 0.0}
    # arguments that are not JSON match nothing, not even the same text
    assert score_calls([Call("convert", NotJSON("{"))], [Call("convert", NotJSON("{"))])["tool_args"] == 0.0


def test_calling_and_answering_scored() -> None:
    # it answered where it should call: wrong choice, no call matched
    assert score_calls([], [WEATHER_PARIS]) == {"tool_choice": 0.0, "tool_name": 0.0, "tool_args": 0.0,
                                                "tool_arg_match": 0.0}
    # it called where it should answer: wrong choice; the call figures do not apply
    assert score_calls([WEATHER_PARIS], []) == {"tool_choice": 0.0, "tool_name": None, "tool_args": None,
                                                "tool_arg_match": None}
    assert score_calls([], [])["tool_choice"] == 1.0


def test_parallel_calls_match_in_any_order_and_extra_calls_count() -> None:
    assert score_calls([CONVERT, WEATHER_PARIS], [WEATHER_PARIS, CONVERT])["tool_args"] == 1.0
    extra = score_calls([WEATHER_PARIS, WEATHER_PARIS], [WEATHER_PARIS])
    assert (extra["tool_name"], extra["tool_args"], extra["tool_arg_match"]) == (0.5, 0.5, 0.5)
    half = score_calls([WEATHER_PARIS], [WEATHER_PARIS, CONVERT])
    assert (half["tool_name"], half["tool_args"]) == (0.5, 0.5)


def test_means_over_the_rows_that_have_each_figure() -> None:
    rows = [score_calls([WEATHER_PARIS], [WEATHER_PARIS]), score_calls([], [CONVERT]), score_calls([], [])]
    assert mean_scores(rows) == {"tool_choice": pytest.approx(2 / 3), "tool_name": 0.5, "tool_args": 0.5,
                                 "tool_arg_match": 0.5}
    assert mean_scores([score_calls([], [])]) == {"tool_choice": 1.0}
    assert mean_scores([]) == {}
