"""A conversation's turns read into one form, OpenAI's: text turns, tool calls, tool results and reasoning.

The layouts read (one row may mix the spellings turn by turn):
- OpenAI chat: role/content; assistant `tool_calls` ([{"id", "type": "function", "function": {"name",
  "arguments"}}], parallel calls included) and the older `function_call`; `tool` turns with `tool_call_id`
  and the older `function` role (matched to its call by name); per-turn `weight` 0/1 on assistant turns;
- ShareGPT (from/value): `function_call` turns (a call as JSON, or a list of them) and `observation` turns;
- Hermes / Glaive: calls as `<tool_call>{json}</tool_call>` inside an assistant (gpt) turn, results as
  `<tool_response>...</tool_response>` inside a `tool` turn (several in one turn answer the calls in order);
- reasoning: `reasoning_content`, `reasoning` or `thinking` on an assistant turn, or `<think>...</think>` at the
  start of its content.

The form (what the chat templates of Qwen, Llama 3.x, Mistral and SmolLM3 render): an assistant turn is
{"role": "assistant", "content": text, "tool_calls"?: [...], "reasoning_content"?: text, "weight"?: 0}, its
calls' `arguments` JSON text of an object (normalised), each call with an id (made up, `callTTTKK`, 9 characters as Mistral wants them, where the row
has none); a tool turn is {"role": "tool", "tool_call_id", "name", "content": text}; tools are
[{"type": "function", "function": {"name", "description"?, "parameters"?}}] (the older `functions` wrapped so).
Keys a turn does not have are absent, never None: templates test `is defined`.

A turn that cannot be read raises BadTurn naming it ("turn 3 of 'messages' ..."). Standard library only: the
parent (api/fine_tune_data.py) checks uploads with it and the worker (worker/data/) reads rows with it.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["ROLES", "BadTurn", "read_tools", "read_turns", "tools_of", "unknown_calls"]

# Text roles by every spelling the formats use; the tool-call roles are read apart (_CALL_ROLES, _RESULT_ROLES).
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system",
         "bot": "assistant", "model": "assistant", "chatgpt": "assistant", "developer": "system"}
_CALL_ROLES = {"function_call", "tool_call"}
_RESULT_ROLES = {"tool", "function", "observation", "ipython", "tool_response"}
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_TOOL_RESPONSE = re.compile(r"<tool_response>\s*(.*?)\s*</tool_response>", re.DOTALL)
_REASONING_FIELDS = ("reasoning_content", "reasoning", "thinking")


class BadTurn(ValueError):
    """A turn (or the row's tools) that cannot be read; the message says which and why."""


# --- tools ---------------------------------------------------------------------------
def _schema_problem(parameters: Any) -> str | None:
    """Why `parameters` is not a JSON Schema of an object (what a function's arguments are), or None."""
    if not isinstance(parameters, dict):
        return f"is a {type(parameters).__name__}, not a JSON Schema object"
    if parameters.get("type") != "object":
        return f"has type {parameters.get('type')!r}; a function's parameters are a schema of type 'object'"
    properties = parameters.get("properties", {})
    if not isinstance(properties, dict) or not all(isinstance(p, dict) for p in properties.values()):
        return "has 'properties' that are not an object of schemas"
    required = parameters.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        return "has 'required' that is not a list of names"
    return None


def read_tools(value: Any, field: str = "tools") -> list[dict[str, Any]]:
    """The row's tools in OpenAI's form; `value` may be JSON text (as ShareGPT files keep it). BadTurn names the
    tool whose schema is wrong."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError as exc:
            raise BadTurn(f"field {field!r} is text that is not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(value, list):
        raise BadTurn(f"field {field!r} is a {type(value).__name__}, not a list of tools")
    tools = []
    for i, tool in enumerate(value, start=1):
        where = f"tool {i} of {field!r}"
        if not isinstance(tool, dict):
            raise BadTurn(f"{where} is not an object")
        function = tool.get("function") if "function" in tool else tool  # the older `functions`: bare
        if tool.get("type", "function") != "function" or not isinstance(function, dict):
            raise BadTurn(f"{where} is not a function ({{\"type\": \"function\", \"function\": {{...}}}})")
        name = function.get("name")
        if not isinstance(name, str) or not name.strip():
            raise BadTurn(f"{where} has no 'name'")
        if "parameters" in function and (problem := _schema_problem(function["parameters"])):
            raise BadTurn(f"{where} ({name!r}): its 'parameters' {problem}")
        tools.append({"type": "function", "function": {k: v for k, v in function.items() if v is not None}})
    return tools


def tools_of(row: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The row's `tools` (or older `functions`), read; None when it has neither."""
    for field in ("tools", "functions"):
        if row.get(field) not in (None, "", []):
            return read_tools(row[field], field)
    return None


def unknown_calls(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[str]:
    """The names the conversation calls that are not among its tools (none when it declares no tools)."""
    if not tools:
        return []
    known = {t["function"]["name"] for t in tools}
    return [c["function"]["name"] for m in messages for c in m.get("tool_calls", ())
            if c["function"]["name"] not in known]


# --- turns ----------------------------------------------------------------------------
def _text(content: Any, where: str) -> str:
    """A turn's text: a string, or OpenAI's list of text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise BadTurn(f"{where} needs role/content text (or from/value)")


def _call(call: Any, where: str, turn: int, k: int) -> dict[str, Any]:
    """One call in OpenAI's form, its arguments JSON text of an object."""
    if not isinstance(call, dict):
        raise BadTurn(f"{where}: call {k} is not an object")
    function = call.get("function", call)  # a bare {"name", "arguments"} (Hermes, ShareGPT)
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or not name.strip():
        raise BadTurn(f"{where}: call {k} has no function name")
    arguments = function.get("arguments", function.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            raise BadTurn(f"{where}: call {k} ({name!r}) has arguments that are not JSON ({exc.msg} at column "
                          f"{exc.colno})") from None
    if not isinstance(arguments, dict):
        raise BadTurn(f"{where}: call {k} ({name!r}) has arguments that are a JSON {type(arguments).__name__}, "
                      "not an object")
    call_id = call.get("id")
    return {"id": str(call_id) if call_id else f"call{turn:03d}{k:02d}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}


def _hermes_calls(content: str, where: str) -> tuple[str, list[Any]]:
    """The content without its <tool_call> blocks, and the calls they hold (parsed JSON)."""
    if "<tool_call>" not in content:
        return content, []
    if content.count("<tool_call>") != content.count("</tool_call>"):
        raise BadTurn(f"{where} has a <tool_call> that is not closed by </tool_call>")
    calls = []
    for block in _TOOL_CALL.findall(content):
        try:
            calls.append(json.loads(block))
        except json.JSONDecodeError as exc:
            raise BadTurn(f"{where} has a <tool_call> that is not JSON ({exc.msg} at column {exc.colno})") from None
    return _TOOL_CALL.sub("", content).strip(), calls


def _reasoning(turn: dict[str, Any], content: str, where: str) -> tuple[str, str | None]:
    """(content, reasoning): from a reasoning field, or a <think> block opening the content."""
    for field in _REASONING_FIELDS:
        if isinstance(turn.get(field), str):
            return content, turn[field]
    stripped = content.lstrip()
    if not stripped.startswith("<think>"):
        return content, None
    end = stripped.find("</think>")
    if end < 0:
        raise BadTurn(f"{where} opens <think> without closing it with </think>")
    return stripped[end + len("</think>"):].lstrip(), stripped[len("<think>"):end].strip()


def _weight(turn: dict[str, Any], where: str) -> dict[str, int]:
    if "weight" not in turn:
        return {}
    weight = turn["weight"]
    if isinstance(weight, bool) or weight not in (0, 1):
        raise BadTurn(f"{where} has weight {weight!r}; weight is 0 (not trained on) or 1")
    return {"weight": 0} if weight == 0 else {}


def _assistant(turn: dict[str, Any], i: int, where: str) -> dict[str, Any]:
    content = turn.get("content", turn.get("value"))
    text = "" if content is None else _text(content, where)
    raw_calls = turn.get("tool_calls") or ([turn["function_call"]] if turn.get("function_call") else [])
    if not isinstance(raw_calls, list):
        raise BadTurn(f"{where} has 'tool_calls' that are not a list")
    if not raw_calls:
        text, raw_calls = _hermes_calls(text, where)
    text, reasoning = _reasoning(turn, text, where)
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if raw_calls:
        message["tool_calls"] = [_call(c, where, i, k) for k, c in enumerate(raw_calls, start=1)]
    elif content is None:
        raise BadTurn(f"{where} needs role/content text (or from/value)")
    if reasoning:
        message["reasoning_content"] = reasoning
    return {**message, **_weight(turn, where)}


def _sharegpt_call(turn: dict[str, Any], i: int, where: str) -> dict[str, Any]:
    value = turn.get("value", turn.get("content"))
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise BadTurn(f"{where} is a function call that is not JSON ({exc.msg} at column {exc.colno})") from None
    calls = value if isinstance(value, list) else [value]
    return {"role": "assistant", "content": "",
            "tool_calls": [_call(c, where, i, k) for k, c in enumerate(calls, start=1)], **_weight(turn, where)}


def _results(turn: dict[str, Any], where: str) -> list[str]:
    """A tool turn's results: its content, or each <tool_response> block it holds."""
    content = turn.get("content", turn.get("value"))
    if isinstance(content, (dict, list)) and not (isinstance(content, list) and content
                                                  and all(isinstance(p, dict) and "text" in p for p in content)):
        return [json.dumps(content, ensure_ascii=False)]
    text = _text(content, where) if content is not None else None
    if text is None:
        raise BadTurn(f"{where} is a tool result with no content")
    blocks = _TOOL_RESPONSE.findall(text)
    return blocks or [text]


def _answer(turn: dict[str, Any], result: str, pending: list[dict[str, Any]], where: str) -> dict[str, Any]:
    """A tool turn answering one of the pending calls: the one its tool_call_id names, else the first pending
    call of its name (the older `function` role), else the first pending call."""
    wanted, name = turn.get("tool_call_id"), turn.get("name")
    if wanted is not None:
        found = next((c for c in pending if c["id"] == str(wanted)), None)
        if found is None:
            raise BadTurn(f"{where} has tool_call_id {wanted!r}, which no earlier unanswered assistant call has")
    else:
        found = next((c for c in pending if c["function"]["name"] == name), None) if name else None
        found = found or (pending[0] if pending else None)
        if found is None:
            raise BadTurn(f"{where} is a tool result, but no assistant call before it awaits one")
    pending.remove(found)
    return {"role": "tool", "tool_call_id": found["id"], "name": found["function"]["name"], "content": result}


def read_turns(turns: list[Any], field: str, *, word: str = "turn") -> list[dict[str, Any]]:
    """The turns of field `field` in OpenAI's form (see the module); BadTurn names the turn that is wrong
    ("{word} 3 of 'messages' ...")."""
    messages: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []  # calls made and not answered yet, in order
    for i, turn in enumerate(turns, start=1):
        where = f"{word} {i} of {field!r}"
        if not isinstance(turn, dict):
            raise BadTurn(f"{where} is not an object")
        raw = turn.get("role", turn.get("from"))
        if raw is None:
            raise BadTurn(f"{where} needs role/content text (or from/value)")
        role = str(raw).strip().lower()
        if role in _RESULT_ROLES:
            messages += [_answer(turn, result, pending, where) for result in _results(turn, where)]
            continue
        if role in _CALL_ROLES:
            message = _sharegpt_call(turn, i, where)
        elif ROLES.get(role) == "assistant":
            message = _assistant(turn, i, where)
        elif role in ROLES:
            message = {"role": ROLES[role], "content": _text(turn.get("content", turn.get("value")), where)}
        else:
            raise BadTurn(f"{where} needs role/content text: unknown role {raw!r}")
        pending += message.get("tool_calls", [])
        messages.append(message)
    return messages
