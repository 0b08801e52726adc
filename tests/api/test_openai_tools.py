"""/v1/chat/completions with tools, through OpenAI's own client: the session's chat job with a tool-calling chat
template (the Hermes/Qwen layout on the tiny model's tags) for what the template renders and the worker begins,
and a scripted pool for what a model that calls writes (the tiny job was not trained on calls)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tunestudio.inference_protocol import Tools
from tunestudio.jobs.models import Job
from tunestudio.settings import Settings

from ..helpers.chat import ChatHome, ScriptedPool, add_saved_step
from ..helpers.jobs import DATA
from ..helpers.server import running_server
from ..helpers.templates import PLAIN_CHAT_TEMPLATE

pytestmark = pytest.mark.timeout(900)

# The tiny model's template, plus tools, calls, tool results and reasoning as Qwen's template writes them.
TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}<|system|>You may call these tools:\n<tools>{% for tool in tools %}\n{{ tool | tojson }}"
    "{% endfor %}\n</tools><|end|>{% endif %}"
    "{% for message in messages %}<|{{ message['role'] }}|>"
    "{% if message['role'] == 'assistant' %}{% generation %}"
    "{% if message.get('reasoning_content') %}<think>{{ message['reasoning_content'] }}</think>{% endif %}"
    "{{ message['content'] or '' }}"
    "{% for call in message.get('tool_calls') or [] %}<tool_call>\n{\"name\": \"{{ call['function']['name'] }}\", "
    "\"arguments\": {{ call['function']['arguments'] | tojson }}}\n</tool_call>{% endfor %}"
    "<|end|>{% endgeneration %}"
    "{% elif message['role'] == 'tool' %}<tool_response>{{ message['content'] }}</tool_response><|end|>"
    "{% else %}{{ message['content'] }}<|end|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CONVERT = {"type": "function", "function": {"name": "convert", "parameters": {"type": "object", "properties": {
    "amount": {"type": "number"}}}}}
TOOLS = [WEATHER, CONVERT]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
LOOP = [*ASK, {"role": "assistant", "content": None, "reasoning_content": "Paris: ask the tool.",
               "tool_calls": [{"id": "call_1", "type": "function",
                               "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]


@pytest.fixture(scope="module")
def job(chat_home: ChatHome) -> Job:
    return chat_home.job


@pytest.fixture(scope="module")
def plain_model(job: Job) -> str:
    """A saved step of the job with a template that calls no tools (the tiny model's before it learnt them)."""
    model = add_saved_step(job, 5)
    (Path(job.output_dir or "") / "checkpoint-5" / "chat_template.jinja").write_text(PLAIN_CHAT_TEMPLATE,
                                                                                     encoding="utf-8")
    return model


@pytest.fixture(scope="module")
def server(chat_home: ChatHome, job: Job, plain_model: str) -> Iterator[str]:
    (Path(job.output_dir or "") / "chat_template.jinja").write_text(TEMPLATE, encoding="utf-8")
    with running_server(Settings(home=chat_home.home, dataset_roots=[DATA])) as url:
        yield url


@pytest.fixture
def client(server: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=120) as client:
        yield client


def prompt(server: str, model: str, **fields: Any) -> httpx.Response:
    return httpx.post(f"{server}/api/chat/prompt", json={"model": model, **fields}, timeout=300)


def test_tools_calls_results_and_reasoning_are_rendered_by_the_template(server: str, job: Job) -> None:
    shown = prompt(server, job.id, messages=LOOP, tools=TOOLS)
    assert shown.status_code == 200, shown.text
    text = shown.json()["prompt"]
    assert json.dumps(WEATHER) in text and json.dumps(CONVERT) in text  # the schemas, as the template writes them
    # the call's arguments reach the template as a dict (its tojson writes them), the result with its call
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<think>Paris: ask the tool.</think>" in text and "<tool_response>sunny, 21 C</tool_response>" in text
    assert text.endswith("<|assistant|>")
    named = prompt(server, job.id, messages=ASK, tools=TOOLS,
                   tool_choice={"type": "function", "function": {"name": "convert"}}).json()["prompt"]
    assert named.endswith('<|assistant|><tool_call>\n{"name": "convert", "arguments": ')  # the reply is begun
    required = prompt(server, job.id, messages=ASK, tools=TOOLS, tool_choice="required").json()["prompt"]
    assert required.endswith('<|assistant|><tool_call>\n{"name": "')
    assert "<tools>" not in prompt(server, job.id, messages=ASK, tools=TOOLS, tool_choice="none").json()["prompt"]


def test_a_named_function_is_a_call_of_it_or_an_error_in_openai_shape(client: openai.OpenAI, job: Job) -> None:
    """The tiny job was never taught calls: after the opener it writes what it writes. Either way the answer is
    a call of the named function with JSON arguments, or a 422 saying the output is no valid call: never a call
    made up, never plain content."""
    choice = {"type": "function", "function": {"name": "get_weather"}}
    try:
        answer = client.chat.completions.create(model=job.id, messages=ASK, tools=TOOLS, tool_choice=choice,
                                                temperature=0, max_tokens=24)
    except openai.UnprocessableEntityError as caught:
        assert caught.code == "invalid_tool_call" and "get_weather" in caught.message
    else:
        call = answer.choices[0].message.tool_calls[0]
        assert call.function.name == "get_weather" and call.id.startswith("call_")
        assert answer.choices[0].finish_reason in ("tool_calls", "length")
    stream = client.chat.completions.create(model=job.id, messages=ASK, tools=TOOLS, tool_choice=choice,
                                            temperature=0, max_tokens=24, stream=True)
    try:
        names = [c.function.name for chunk in stream for c in (chunk.choices[0].delta.tool_calls or [] if
                                                               chunk.choices else []) if c.function.name]
    except openai.APIError as caught:
        assert "get_weather" in caught.message
    else:
        assert names == ["get_weather"]


def test_a_template_that_calls_no_tools_is_a_400_saying_so(client: openai.OpenAI, plain_model: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=plain_model, messages=ASK, tools=TOOLS)
    assert caught.value.code == "tools_unsupported" and "does not call tools" in caught.value.message
    answer = client.chat.completions.create(model=plain_model, messages=ASK, max_tokens=2)  # without tools: as ever
    assert answer.choices[0].message.tool_calls is None


@pytest.mark.parametrize(("fields", "says"), [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "launch"}}}, "not among tools"),
    ({"tool_choice": "required"}, "no tools are given"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]}, "type object"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"properties": [1]}}}]}, "properties"),
    ({"messages": [*ASK, {"role": "tool", "tool_call_id": "call_9", "content": "x"}]}, "answers no call"),
    ({"messages": [*ASK, {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function",
                                                                                "function": {"name": "f",
                                                                                             "arguments": "{x"}}]}]},
     "not JSON"),
    ({"messages": [*ASK, {"role": "user", "content": None}]}, "content may be null only"),
])
def test_bad_tool_requests_are_400_in_openai_shape(server: str, job: Job, fields: dict[str, Any],
                                                   says: str) -> None:
    answer = httpx.post(f"{server}/v1/chat/completions", json={"model": job.id, "messages": ASK, **fields},
                        timeout=60)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert says in error["message"] and error["type"] == "invalid_request_error"


# --- what a model that calls writes: a scripted pool -------------------------------------------------------------
@pytest.fixture
def scripted(chat_home: ChatHome, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ScriptedPool, openai.OpenAI]]:
    pool = ScriptedPool([""])
    monkeypatch.setattr("tunestudio.api.InferencePool", lambda *args, **kwargs: pool)
    with running_server(Settings(home=chat_home.home)) as url, \
            openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60) as client:
        yield pool, client


CALLING = ('<think>Weather and money.</think>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
           '\n</tool_call>\n<tool_call>\n{"name": "convert", "arguments": {"amount": 3}}\n</tool_call>')


def test_calls_come_as_openai_tool_calls_whole_and_streamed(scripted: tuple[ScriptedPool, openai.OpenAI],
                                                            job: Job) -> None:
    pool, client = scripted
    pool.outputs = [CALLING]
    whole = client.chat.completions.create(model=job.id, messages=LOOP, tools=TOOLS)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.reasoning_content == "Weather and money."  # beside content, as vLLM's
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == [
        ("get_weather", {"city": "Paris"}), ("convert", {"amount": 3})]
    messages, tools = pool.requests[-1]
    assert tools == Tools(TOOLS, "auto", True)  # the tools reach the worker as sent, and the turns as the template
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}  # reads them
    assert messages[1]["content"] == "" and messages[2] == {"role": "tool", "content": "sunny, 21 C",
                                                            "tool_call_id": "call_1", "name": "get_weather"}

    chunks = list(client.chat.completions.create(model=job.id, messages=LOOP, tools=TOOLS, stream=True))
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for piece in chunk.choices[0].delta.tool_calls or []:
            call = calls.setdefault(piece.index, {"id": piece.id, "name": piece.function.name, "arguments": ""})
            call["arguments"] += piece.function.arguments or ""
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        ("get_weather", {"city": "Paris"}), ("convert", {"amount": 3})]
    assert all(c["id"].startswith("call_") for c in calls.values())
    assert "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks) == \
        "Weather and money."
    assert chunks[-1].choices[0].finish_reason == "tool_calls"

    single = client.chat.completions.create(model=job.id, messages=LOOP, tools=TOOLS, parallel_tool_calls=False)
    assert [c.function.name for c in single.choices[0].message.tool_calls] == ["get_weather"]


def test_a_named_function_begun_by_the_opener_streams_its_id_and_name_first(
        scripted: tuple[ScriptedPool, openai.OpenAI], job: Job) -> None:
    pool, client = scripted
    pool.outputs = ['<tool_call>\n{"name": "convert", "arguments": {"amount": 3}}\n</tool_call>']
    named = {"type": "function", "function": {"name": "convert"}}
    chunks = list(client.chat.completions.create(model=job.id, messages=ASK, tools=TOOLS, tool_choice=named,
                                                 stream=True))
    pieces = [p for c in chunks if c.choices for p in c.choices[0].delta.tool_calls or []]
    assert pieces[0].id.startswith("call_") and pieces[0].function.name == "convert"
    assert json.loads("".join(p.function.arguments or "" for p in pieces)) == {"amount": 3}
    assert pool.requests[-1][1] == Tools(TOOLS, "convert", True)


def test_no_valid_call_where_one_must_come_is_an_error_not_a_made_up_call(
        scripted: tuple[ScriptedPool, openai.OpenAI], job: Job) -> None:
    pool, client = scripted
    pool.outputs = ['<tool_call>\n{"name": "get_weather", "arguments": moo moo']
    named = {"type": "function", "function": {"name": "get_weather"}}
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        client.chat.completions.create(model=job.id, messages=ASK, tools=TOOLS, tool_choice=named)
    assert caught.value.code == "invalid_tool_call" and "call to get_weather is not JSON" in caught.value.message
    with pytest.raises(openai.APIError) as streamed:
        list(client.chat.completions.create(model=job.id, messages=ASK, tools=TOOLS, tool_choice=named, stream=True))
    assert "call to get_weather is not JSON" in streamed.value.message
    pool.outputs = ["I will not call."]  # under auto: content, as written
    pool.requests.clear()
    answer = client.chat.completions.create(model=job.id, messages=ASK, tools=TOOLS)
    assert answer.choices[0].message.content == "I will not call." and answer.choices[0].finish_reason == "stop"
