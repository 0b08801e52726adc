"""Scoring the tool calls of held-out rows: did the model call when it should, the right function, with the right
arguments.

A held-out row is a tool row when it comes with `tools`; its reference is the last assistant turn, either calls
(`tool_calls`) or an answer. The model's output is read into calls by the parser of its chat template's family
(`reader_for`: tunestudio.tool_calls). Per row, 0..1 each:

- tool_choice: it called a tool when the reference calls one, and answered without one when the reference answers;
- tool_name: of the calls (the reference's, and any extra call of the answer), the share matched by a call of the
  same function;
- tool_args: of the same, the share matched by a call of the same function whose arguments are equal as JSON
  (parsed, so key order and spacing do not count; 5 and "5" differ);
- tool_arg_match: of each matched call, the share of the argument names (the reference's and the call's together)
  whose values are equal as JSON; an unmatched reference call, or an extra call, counts 0.

A call of the answer is matched to a reference call of the same function, first come first served (parallel calls
may come in any order); what is left over on either side is unmatched. tool_choice is measured on every tool row;
the other three only where the reference calls (None elsewhere). A row without tools carries none of them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tunestudio.config.vocabulary import TOOL_METRICS
from tunestudio.tool_calls import detect, parse, thinks


@dataclass(frozen=True)
class Call:
    name: str
    arguments: Any  # the parsed JSON value; a text that is not JSON stays text (NotJSON), equal to nothing


@dataclass(frozen=True)
class NotJSON:
    text: str

    def __eq__(self, other: object) -> bool:  # arguments that are not JSON never match, not even themselves
        return False

    __hash__ = None  # type: ignore[assignment]


Reader = Callable[[str], list[Call]]


def arguments_of(value: Any) -> Any:
    """A call's arguments as JSON: a dict (OpenAI sends a JSON text, some datasets the object itself)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return NotJSON(value)
    return value


def calls_of(message: dict[str, Any]) -> list[Call]:
    """The calls of an assistant turn in OpenAI's form (`tool_calls`, or the older `function_call`)."""
    calls = message.get("tool_calls") or ([message["function_call"]] if message.get("function_call") else [])
    out = []
    for call in calls:
        function = call.get("function", call) if isinstance(call, dict) else {}
        out.append(Call(str(function.get("name", "")), arguments_of(function.get("arguments", {}))))
    return out


def reader_for(template: str | None) -> Reader:
    """How the model's output is read into calls: the parser of its chat template's family
    (tunestudio.tool_calls, as /v1/chat/completions reads it), after any thinking. A call whose arguments break
    off is a call whose arguments are not JSON; a template that writes no calls reads none."""
    family, think = detect(template), thinks(template)

    def read(text: str) -> list[Call]:
        return [Call(c.name, arguments_of(c.arguments)) for c in parse(text, family, think=think).tool_calls]

    return read


def _pairs(predicted: Sequence[Call], expected: Sequence[Call]) -> tuple[list[tuple[Call, Call]], int]:
    """(reference call, answer call) pairs of the same function, and how many calls are left over on both sides."""
    free = list(predicted)
    pairs = []
    for want in expected:
        match = next((c for c in free if c.name == want.name), None)
        if match is not None:
            free.remove(match)
            pairs.append((want, match))
    return pairs, (len(expected) - len(pairs)) + len(free)


def _argument_share(want: Any, got: Any) -> float:
    if not isinstance(want, dict) or not isinstance(got, dict):
        return float(want == got)
    names = set(want) | set(got)
    if not names:
        return 1.0
    return sum(1 for k in names if k in want and k in got and want[k] == got[k]) / len(names)


def score_calls(predicted: Sequence[Call], expected: Sequence[Call]) -> dict[str, float | None]:
    """The four figures of one row (module docstring): expected is the reference's calls, [] for an answer."""
    scores: dict[str, float | None] = {"tool_choice": float(bool(predicted) == bool(expected))}
    if not expected:
        return {**scores, "tool_name": None, "tool_args": None, "tool_arg_match": None}
    pairs, left = _pairs(predicted, expected)
    calls = len(pairs) + left
    named = len(pairs) / calls
    exact = sum(1 for want, got in pairs if want.arguments == got.arguments) / calls
    share = sum(_argument_share(want.arguments, got.arguments) for want, got in pairs) / calls
    return {**scores, "tool_name": named, "tool_args": exact, "tool_arg_match": share}


def mean_scores(rows: Sequence[dict[str, float | None]]) -> dict[str, float]:
    """Each figure's mean over the rows that have it; a figure no row has is left out."""
    out = {}
    for name in TOOL_METRICS:
        values = [r[name] for r in rows if r.get(name) is not None]
        if values:
            out[name] = sum(v for v in values if v is not None) / len(values)
    return out


# --- rendering a tool row --------------------------------------------------------------
def chat_text(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
              generation_prompt: bool) -> str:
    return str(tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                             add_generation_prompt=generation_prompt))


def reply_text(tokenizer: Any, prompt: list[dict[str, Any]], reply: dict[str, Any],
               tools: list[dict[str, Any]] | None) -> str | None:
    """What the chat template writes for `reply` after the prompt's generation prompt, without its end of turn:
    the text a model that answers as the reference does would write; None when the template does not render the
    prompt as the beginning of the whole conversation."""
    head = chat_text(tokenizer, prompt, tools, True)
    whole = chat_text(tokenizer, [*prompt, reply], tools, False)
    if not whole.startswith(head):
        return None
    text = whole[len(head):].rstrip()
    eos = tokenizer.eos_token
    if eos and text.endswith(eos):
        text = text[: -len(eos)]
    return text.strip()
