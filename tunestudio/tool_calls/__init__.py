"""Tool calls and reasoning in a model's output, per chat template family: pure Python, for both sides.

The parent (`/v1/chat/completions`) reads a model's output with it; the worker asks it which family a
template is and what a reply that must call begins with; the evaluation scores calls with it. Nothing heavy is
imported here.

- `detect(template)`: the family a chat template's text writes calls in (`Hermes`/Qwen `<tool_call>` JSON,
  `Llama3` JSON, `Mistral` `[TOOL_CALLS]`, gpt-oss `Harmony`), or None: this model's template does not call
  tools (`NoToolTemplate` says so).
- `Family.opener(name)`: what a reply begins with when it must call (the named function's name in it).
- `parse(text, family, names)`: a whole output as `Parsed` (content, reasoning, calls with ids, names and
  JSON-text arguments; text that is not a valid call stays content; a broken call's error).
- `CallStream`: the same read as the output streams, answering OpenAI's chunk deltas.
- `split_think`: `<think>…</think>` reasoning split from the rest.
"""

from __future__ import annotations

from tunestudio.tool_calls.families import (
    FAMILIES,
    Call,
    Family,
    Harmony,
    Hermes,
    Llama3,
    Mistral,
    Text,
    detect,
    family_named,
)
from tunestudio.tool_calls.stream import END_THINK, THINK, CallStream, Parsed, ToolCall, parse, split_think

NO_TOOLS = "this model's chat template does not call tools (it renders no `tools` and no tool calls)"


class NoToolTemplate(ValueError):
    """The model's chat template does not call tools."""

    def __init__(self, message: str = NO_TOOLS) -> None:
        super().__init__(message)


def family_for(template: str | None) -> Family:
    """The template's family; NoToolTemplate when it has none."""
    family = detect(template)
    if family is None:
        raise NoToolTemplate()
    return family


def thinks(template: str | None) -> bool:
    """Whether the template writes `<think>` reasoning."""
    return bool(template) and END_THINK in (template or "")


__all__ = [
    "END_THINK",
    "FAMILIES",
    "NO_TOOLS",
    "THINK",
    "Call",
    "CallStream",
    "Family",
    "Harmony",
    "Hermes",
    "Llama3",
    "Mistral",
    "NoToolTemplate",
    "Parsed",
    "Text",
    "ToolCall",
    "detect",
    "family_for",
    "family_named",
    "parse",
    "split_think",
    "thinks",
]
