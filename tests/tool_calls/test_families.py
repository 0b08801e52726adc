"""Each template family's calls read from outputs written as its models write them (strings, nothing loaded)."""

from __future__ import annotations

import json

import pytest

from tunestudio.tool_calls import (
    Family,
    Harmony,
    Hermes,
    Llama3,
    Mistral,
    NoToolTemplate,
    detect,
    family_for,
    family_named,
    parse,
)

NAMES = {"get_weather", "convert"}
WEATHER = '{"city": "Paris"}'
CONVERT = '{"amount": 3, "from": "EUR", "to": "USD"}'


def calls(text: str, family: Family, names: set[str] | None = NAMES) -> list[tuple[str, str]]:
    return [(c.name, c.arguments) for c in parse(text, family, names).tool_calls]


# --- detection, from the template's text -----------------------------------------------------------------------
QWEN = ('{%- if tools %}<tools>{% for tool in tools %}{{ tool | tojson }}{% endfor %}</tools>{%- endif %}'
        '{%- for tool_call in message.tool_calls %}<tool_call>\\n{"name": "{{ tool_call.name }}", "arguments": '
        '{{ tool_call.arguments | tojson }}}\\n</tool_call>{%- endfor %}<think>\\n\\n</think>')
LLAMA = ('{%- if tools is not none %}Given the following functions...{%- for t in tools %}{{ t | tojson }}'
         '{%- endfor %}{%- endif %}{{- \'{"name": "\' + tool_call.name + \'", \' }}{{- \'"parameters": \' }}'
         '<|start_header_id|>ipython<|end_header_id|>')
MISTRAL_V3 = '{%- if tools %}[AVAILABLE_TOOLS]{{ tools|tojson }}[/AVAILABLE_TOOLS]{%- endif %}[TOOL_CALLS][...]'
MISTRAL_V11 = '[AVAILABLE_TOOLS]{{ tools|tojson }}[/AVAILABLE_TOOLS][TOOL_CALLS]{{ name }}[ARGS]{{ arguments }}'
GPT_OSS = ('<|start|>assistant to=functions.{{ tool_call.name }}<|channel|>commentary json<|message|>'
           '{{ tool_call.arguments|tojson }}<|call|>')
PLAIN = "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>{% endfor %}"


@pytest.mark.parametrize(("template", "name"), [(QWEN, "hermes"), (LLAMA, "llama3"), (MISTRAL_V3, "mistral"),
                                                (MISTRAL_V11, "mistral-args"), (GPT_OSS, "harmony")])
def test_the_family_is_read_from_the_template(template: str, name: str) -> None:
    family = detect(template)
    assert family is not None and family.name == name
    assert family_named(name).name == name


def test_a_template_that_does_not_call_tools_is_refused_with_that_reason() -> None:
    assert detect(PLAIN) is None and detect(None) is None
    with pytest.raises(NoToolTemplate, match="does not call tools"):
        family_for(PLAIN)


# --- openers: what a reply begins with when it must call -------------------------------------------------------
@pytest.mark.parametrize("family", [Hermes(), Llama3(), Mistral(), Mistral(args_layout=True), Harmony()])
def test_an_opener_with_the_name_and_the_arguments_is_read_as_that_call(family: Family) -> None:
    text = family.opener("get_weather") + WEATHER + {"hermes": "}\n</tool_call>", "llama3": "}", "mistral": "}]",
                                                     "mistral-args": "", "harmony": "<|call|>"}[family.name]
    assert calls(text, family) == [("get_weather", WEATHER)]
    assert "get_weather" not in family.opener() and family.opener("x").startswith(family.opener())


# --- Hermes / Qwen -------------------------------------------------------------------------------------------------
def test_hermes_reads_parallel_calls_and_keeps_the_text_around_them() -> None:
    text = (f'Let me check.\n<tool_call>\n{{"name": "get_weather", "arguments": {WEATHER}}}\n</tool_call>\n'
            f'<tool_call>\n{{"name": "convert", "arguments": {CONVERT}}}\n</tool_call>')
    parsed = parse(text, Hermes(), NAMES)
    assert parsed.content == "Let me check." and parsed.error is None
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("get_weather", WEATHER), ("convert", CONVERT)]
    assert all(c.id.startswith("call_") and len(c.id) == 29 for c in parsed.tool_calls)
    assert len({c.id for c in parsed.tool_calls}) == 2


@pytest.mark.parametrize("text", [
    "<tool_call>\nnot json at all\n</tool_call>",
    '<tool_call>\n{"name": "launch_rocket", "arguments": {}}\n</tool_call>',  # not among the tools
    '<tool_call>\n{"arguments": {}}\n</tool_call>',  # no name
    '<tool_call>\n{"name": 3, "arguments": {}}\n</tool_call>',
    "I would write <tool_call> here.",
])
def test_hermes_text_that_is_no_valid_call_stays_content(text: str) -> None:
    parsed = parse(text, Hermes(), NAMES)
    assert parsed.tool_calls == [] and parsed.content == text.strip() and parsed.error is None


@pytest.mark.parametrize(("text", "why"), [
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": Paris}}\n</tool_call>', "not JSON"),
    ('<tool_call>\n{"name": "get_weather", "arguments": "Paris"}\n</tool_call>', "not a JSON object"),
    ('<tool_call>\n{"name": "get_weather", "arguments": moo moo', "is not JSON"),
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par', "ends before"),
])
def test_hermes_a_call_that_half_parses_is_an_error_not_content(text: str, why: str) -> None:
    parsed = parse(text, Hermes(), NAMES)
    assert parsed.error is not None and why in parsed.error and "get_weather" in parsed.error
    assert parsed.cut == (why == "ends before")  # only a call the output's end cut may be sent as it stands


def test_hermes_a_call_without_arguments_has_an_empty_object_and_any_name_counts_without_names() -> None:
    assert calls('<tool_call>{"name": "now"}</tool_call>', Hermes(), None) == [("now", "{}")]


# --- Llama 3 ---------------------------------------------------------------------------------------------------------
def test_llama3_reads_json_calls_with_parameters_after_the_python_tag_and_separated_by_semicolons() -> None:
    assert calls(f'{{"name": "get_weather", "parameters": {WEATHER}}}', Llama3()) == [("get_weather", WEATHER)]
    text = f'<|python_tag|>{{"name": "get_weather", "parameters": {WEATHER}}}; {{"name": "convert", ' \
           f'"parameters": {CONVERT}}}'
    assert calls(text, Llama3()) == [("get_weather", WEATHER), ("convert", CONVERT)]


@pytest.mark.parametrize("text", ["The weather is fine.", '{"answer": 42}', 'Sure: {"name": "get_weather"}'])
def test_llama3_text_that_does_not_begin_with_a_call_is_content(text: str) -> None:
    parsed = parse(text, Llama3(), NAMES)
    assert parsed.tool_calls == [] and parsed.content == text


# --- Mistral ---------------------------------------------------------------------------------------------------------
def test_mistral_reads_a_list_of_calls_with_nine_character_ids() -> None:
    text = f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {WEATHER}}}, {{"name": "convert", ' \
           f'"arguments": {CONVERT}}}]'
    parsed = parse(text, Mistral(), NAMES)
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("get_weather", WEATHER), ("convert", CONVERT)]
    assert all(len(c.id) == 9 and c.id.isalnum() for c in parsed.tool_calls)  # its templates refuse other ids


def test_mistral_reads_the_name_args_layout_and_text_before_the_calls() -> None:
    text = f"On it.[TOOL_CALLS]get_weather[ARGS]{WEATHER}[TOOL_CALLS]convert[ARGS]{CONVERT}"
    parsed = parse(text, Mistral(args_layout=True), NAMES)
    assert parsed.content == "On it."
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("get_weather", WEATHER), ("convert", CONVERT)]


def test_mistral_a_marker_without_a_call_stays_content() -> None:
    assert parse("[TOOL_CALLS] nothing", Mistral(), NAMES).content == "[TOOL_CALLS] nothing"


# --- gpt-oss harmony -------------------------------------------------------------------------------------------------
def test_harmony_splits_analysis_from_the_final_answer() -> None:
    text = "<|channel|>analysis<|message|>The user greets.<|end|><|start|>assistant<|channel|>final<|message|>Hi!"
    parsed = parse(text, Harmony(), NAMES)
    assert (parsed.reasoning, parsed.content, parsed.tool_calls) == ("The user greets.", "Hi!", [])


@pytest.mark.parametrize("call", [
    f"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{WEATHER}<|call|>",
    f" to=functions.get_weather<|channel|>commentary json<|message|>{WEATHER}<|call|>",
])
def test_harmony_reads_a_call_with_its_recipient_before_or_after_the_channel(call: str) -> None:
    text = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant" + call
    parsed = parse(text, Harmony(), NAMES)
    assert parsed.reasoning == "Need weather." and parsed.content is None
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [("get_weather", {"city": "Paris"})]


def test_harmony_plain_text_is_content() -> None:
    assert parse("Just words.", Harmony(), NAMES).content == "Just words."
