"""worker/serve/prompting.py: a chat request's prompt with tools, through real chat templates and the tiny tokenizer.

The opener a reply is begun with under a named tool_choice must be how the template itself writes that call (the
tokens the model trained on): the history's call, rendered by the template, holds the opener followed by its
arguments. The real templates are those tests/worker/templates holds (issue 41's training tests write them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tunestudio.inference_protocol import Tools
from tunestudio.tool_calls import detect
from tunestudio.worker.errors import UserFacing
from tunestudio.worker.serve.prompting import chat_prompt

from ..helpers.templates import PLAIN_CHAT_TEMPLATE

TEMPLATES = Path(__file__).parent / "templates"
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string"}}, "required": ["city"]}}}
TURNS: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "sunny"},
    {"role": "assistant", "content": "Sunny."},
    {"role": "user", "content": "And in Rome?"},
]


@pytest.fixture
def tokenizer(tiny_model: Path) -> Any:
    """The tiny model's tokenizer, fresh for each test (the tests set templates)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.mark.parametrize(("name", "family"), [("qwen2_5.jinja", "hermes"), ("qwen3.jinja", "hermes"),
                                              ("llama3_1.jinja", "llama3")])
def test_a_named_call_is_begun_as_the_template_writes_calls(tokenizer: Any, name: str, family: str) -> None:
    if not (TEMPLATES / name).is_file():
        pytest.skip(f"{name} is not in tests/worker/templates")
    tokenizer.chat_template = (TEMPLATES / name).read_text(encoding="utf-8")
    prompt = chat_prompt(tokenizer, TURNS, Tools([WEATHER], "get_weather"))
    text = tokenizer.decode(prompt.ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    assert prompt.family is not None and prompt.family.name == family
    opener = prompt.family.opener("get_weather")
    assert prompt.prefix == opener and text.endswith(opener)  # the reply is begun with the call
    assert opener + '{"city": "Paris"}' in text  # as the template wrote the history's call
    assert '"description": "The weather in a city."' in text  # the schema rendered
    auto = chat_prompt(tokenizer, TURNS, Tools([WEATHER]))
    assert auto.prefix == "" and not tokenizer.decode(auto.ids).endswith(opener)
    assert auto.think == ("qwen3" in name)


def test_a_template_that_calls_no_tools_or_drops_them_is_refused(tokenizer: Any) -> None:
    plain = tokenizer.chat_template = PLAIN_CHAT_TEMPLATE
    assert detect(plain) is None
    with pytest.raises(UserFacing, match="does not call tools") as caught:
        chat_prompt(tokenizer, TURNS[:1], Tools([WEATHER]))
    assert caught.value.status == 400
    with pytest.raises(UserFacing, match="does not call tools"):  # a call in the history needs one too
        chat_prompt(tokenizer, TURNS, None)
    tokenizer.chat_template = plain.replace("{{ bos_token }}", "{{ bos_token }}{# <tool_call> #}")
    with pytest.raises(UserFacing, match=r"did not render the functions \['get_weather'\]"):
        chat_prompt(tokenizer, TURNS[:1], Tools([WEATHER]))


def test_the_stream_keeps_a_family_s_markers_where_they_are_special_tokens_and_drops_the_others(
        tokenizer: Any) -> None:
    import torch

    from tunestudio.worker.serve.generation import TextStream

    tokenizer.add_special_tokens({"additional_special_tokens": ["<tool_call>", "</tool_call>"]})
    ids = tokenizer.encode('<tool_call>{"name": "f"}</tool_call><|end|>', add_special_tokens=False)
    marked = ("<tool_call>", "</tool_call>")
    for keep, shown in [((), '{"name": "f"}'), (marked, '<tool_call>{"name": "f"}</tool_call>')]:
        sent: list[str] = []
        stream = TextStream(tokenizer, sent.append, [], keep)
        stream.put(torch.tensor([[0]]))  # generate hands over the prompt first
        for token in ids:
            stream.put(torch.tensor([token]))
        stream.end()
        assert "".join(sent) == shown  # <|end|>, a special token no family needs, is never text
