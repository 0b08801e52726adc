"""What the teacher is asked for each task, and its reply read into a training row's messages.

qa: one question a reader of the chunk could ask and its answer, grounded in the chunk, as JSON
{"question", "answer"}. conversation: a short exchange about the chunk, as JSON {"messages": [...]} alternating
user and assistant. answer and preference: the user's own prompt, answered in plain text (sequence-level
distillation; preference asks twice, see job.py). tools: the prompt sent with the recipe's `tools`, as OpenAI's API
takes them; the reply's `tool_calls` (or `<tool_call>` text, read by tunestudio.chat_rows) or its answer.
A reply that is not what was asked for raises `Unparsed` (the "parse" gate); a call to a function the tools do not
have, or whose arguments break its JSON Schema, raises `Unschemed` (the "schema" gate).
"""

from __future__ import annotations

import json
import re
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from tunestudio.chat_rows import BadTurn, read_turns, unknown_calls
from tunestudio.worker.make_data.documents import Chunk, Prompt

__all__ = ["Unparsed", "Unschemed", "check_calls", "messages_of", "request_for"]

_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")
SYSTEM = "You write training data for a language model. Follow the format asked for exactly."


class Unparsed(ValueError):
    """The teacher's reply is not what the task asked for."""


class Unschemed(ValueError):
    """A tool call the recipe's tools do not allow: an unknown function, or arguments its schema refuses."""


def request_for(task: str, source: Chunk | Prompt, variant: int, turns: int) -> list[dict[str, str]]:
    """The chat messages sent to the teacher for one row."""
    if isinstance(source, Prompt):
        system = [{"role": "system", "content": source.system}] if source.system else []
        return [*system, {"role": "user", "content": source.text}]
    where = f" (page {source.page})" if source.page else f" (section: {source.heading})" if source.heading else ""
    text = f"Document excerpt{where}:\n<<<\n{source.text}\n>>>\n\n"
    other = f" Ask something different from the {variant} question(s) most readers would ask first." if variant else ""
    if task == "qa":
        ask = ("Write one question a reader could ask about this excerpt and its answer, using only facts stated "
               f"in it.{other} Reply with JSON only: {{\"question\": \"...\", \"answer\": \"...\"}}")
    else:
        ask = (f"Write a conversation of {turns} user turns, each followed by an assistant turn, in which a user asks "
               f"about this excerpt and the assistant answers from it alone.{other} Reply with JSON only: "
               '{"messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}, ...]}')
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text + ask}]


def messages_of(task: str, source: Chunk | Prompt, message: dict[str, Any]) -> list[dict[str, Any]]:
    """The training row's messages from the teacher's reply message (its text; for `tools`, its calls too);
    Unparsed when the reply is not what was asked."""
    if task == "tools":
        return _tool_turns(source, message)
    reply = str(message.get("content") or "")
    if isinstance(source, Prompt):
        if not reply.strip():
            raise Unparsed("the reply is empty")
        system = [{"role": "system", "content": source.system}] if source.system else []
        return [*system, {"role": "user", "content": source.text}, {"role": "assistant", "content": reply.strip()}]
    data = _json(reply)
    if task == "qa":
        question, answer = data.get("question"), data.get("answer")
        if not isinstance(question, str) or not isinstance(answer, str):
            raise Unparsed('the JSON has no string "question" and "answer"')
        return [{"role": "user", "content": question.strip()}, {"role": "assistant", "content": answer.strip()}]
    messages = data.get("messages")
    if not isinstance(messages, list) or len(messages) < 2:
        raise Unparsed('the JSON has no "messages" list of two turns or more')
    for n, turn in enumerate(messages):
        role = "user" if n % 2 == 0 else "assistant"
        if not isinstance(turn, dict) or turn.get("role") != role or not isinstance(turn.get("content"), str):
            raise Unparsed(f"messages[{n}] is not a {role} turn with text content")
    if messages[-1]["role"] != "assistant":
        raise Unparsed("the conversation does not end with an assistant turn")
    return [{"role": t["role"], "content": t["content"].strip()} for t in messages]


def _tool_turns(source: Chunk | Prompt, message: dict[str, Any]) -> list[dict[str, Any]]:
    """The prompt and the teacher's turn in the form tunestudio trains on (calls with ids, arguments JSON text)."""
    assert isinstance(source, Prompt), "the tools task asks prompts"
    turn = {"role": "assistant", "content": message.get("content") or ""}
    for field in ("tool_calls", "function_call"):
        if message.get(field):
            turn[field] = message[field]
    try:
        (assistant,) = read_turns([turn], "the reply")
    except BadTurn as exc:
        raise Unparsed(str(exc).replace("turn 1 of 'the reply'", "the reply")) from None
    if not assistant.get("tool_calls") and not assistant["content"].strip():
        raise Unparsed("the reply has neither a tool call nor an answer")
    system = [{"role": "system", "content": source.system}] if source.system else []
    return [*system, {"role": "user", "content": source.text}, assistant]


def check_calls(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> None:
    """Unschemed unless every call names one of `tools` and its arguments fit that function's JSON Schema."""
    functions = {t["function"]["name"]: t["function"].get("parameters") for t in tools}
    if unknown := unknown_calls(messages, tools):
        raise Unschemed(f"calls {unknown[0]!r}, which is not among the tools ({', '.join(sorted(functions))})")
    for turn in messages:
        for call in turn.get("tool_calls", ()):
            name = call["function"]["name"]
            schema = functions[name]
            if schema is None:
                continue
            arguments = json.loads(call["function"]["arguments"])
            try:
                problem = next(iter(Draft202012Validator(schema).iter_errors(arguments)), None)
            except SchemaError as exc:
                raise Unschemed(f"{name!r}'s parameters are not a valid JSON Schema ({exc.message})") from None
            if problem is not None:
                where = "/".join(map(str, problem.absolute_path)) or "the arguments"
                raise Unschemed(f"{name!r} called with {where}: {problem.message}")


def _json(reply: str) -> dict[str, Any]:
    text = _FENCE.sub("", reply.strip())
    start, end = text.find("{"), text.rfind("}")
    try:
        data = json.loads(text[start:end + 1]) if start >= 0 else None
    except ValueError as exc:
        raise Unparsed(f"the reply is not JSON ({exc.args[0] if exc.args else exc})") from None
    if not isinstance(data, dict):
        raise Unparsed("the reply is not a JSON object")
    return data
