"""What the teacher is asked for each task, and its reply read into a training row's messages.

qa: one question a reader of the chunk could ask and its answer, grounded in the chunk, as JSON
{"question", "answer"}. conversation: a short exchange about the chunk, as JSON {"messages": [...]} alternating
user and assistant. answer: the user's own prompt, answered in plain text (sequence-level distillation).
A reply that is not what was asked for raises `Unparsed` (the "parse" gate).
"""

from __future__ import annotations

import json
import re
from typing import Any

from tunestudio.worker.make_data.documents import Chunk, Prompt

__all__ = ["Unparsed", "messages_of", "request_for"]

_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")
SYSTEM = "You write training data for a language model. Follow the format asked for exactly."


class Unparsed(ValueError):
    """The teacher's reply is not what the task asked for."""


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


def messages_of(task: str, source: Chunk | Prompt, reply: str) -> list[dict[str, str]]:
    """The training row's messages from the teacher's reply; Unparsed when the reply is not what was asked."""
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
