"""Conversations tokenised with the model's own chat template, with a loss mask per assistant turn.

Most real templates have no `{% generation %}` markers, so the mask is found by rendering the conversation
prefix by prefix: turn i of a conversation of messages m begins where `render(m[:i], generation prompt)` ends
and ends where `render(m[:i + 1])` ends, and both must be prefixes of the whole rendering, `render(m)` (the
prefix property). Each span, cut out by character, is mapped onto the tokens of the whole text (a token is
trained when it starts inside a span): the reply, its tool calls and the template's end-of-turn token are
trained; system, user, tool results and the tools' schema are not; nor a turn with `weight` 0.

Where a template rewrites a turn once later turns follow it (Qwen3 drops the reasoning of the rounds before the
last user message, and writes an empty <think></think> only in the last turn), that turn is not trained inside
the whole conversation, which shows it in a shape the model never generates; it is trained in a row of its own
that ends with it (the conversation up to it, earlier turns as context), as the model writes it at inference.
A template whose generation prompt is not where the assistant turn begins is refused with the reason.

Reasoning (`JobConfig.reasoning`): `keep` trains on it, `mask` keeps it in context without loss (the text
between <think> and </think>, or the template's own markers; the markers themselves are trained), `drop`
strips it; `auto` keeps it where the template renders reasoning and drops it where the template ignores it.
A template that does not render `reasoning_content` gets it, under keep and mask, as `<think>...</think>` at
the start of the content.

The rows given to TRL are `input_ids` and `assistant_masks` (1: trained): SFTTrainer takes a dataset with
`input_ids` as tokenised, turns `assistant_masks` into its labels, and does not render it again; so nothing
goes through Arrow's unification of nested dicts (which fills missing keys with None) on the way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tunestudio.worker.data.conversations import RowProblem
from tunestudio.worker.errors import UserError

__all__ = ["Renderer", "check_tools", "renderer_for", "renders_reasoning", "template_name"]

_PROBE = "tunestudio_probe_7f3a"
_THINK = "<think>\n{}\n</think>\n\n"


def template_name(tokenizer: Any) -> str:
    return f"the chat template of {getattr(tokenizer, 'name_or_path', '') or 'the model'}"


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
            generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=generation_prompt,
                                         tokenize=False)


def _probe_call() -> dict[str, Any]:
    return {"role": "assistant", "content": "",
            "tool_calls": [{"id": "call00101", "type": "function",
                            "function": {"name": _PROBE, "arguments": {"city": "Paris"}}}]}


def _probe(tokenizer: Any, build: Any) -> str | None:
    """The text `build(tokenizer)` renders, or None if the template raises."""
    try:
        return build(tokenizer)
    except Exception:  # a template raising on a probe cannot render it; the caller says so
        return None


def renders_reasoning(tokenizer: Any) -> bool:
    """Whether the template renders an assistant turn's `reasoning_content`."""
    user = {"role": "user", "content": "hi"}
    text = _probe(tokenizer, lambda t: _render(t, [user, {"role": "assistant", "content": "ok",
                                                          "reasoning_content": _PROBE}], None, False))
    return text is not None and _PROBE in text


def check_tools(tokenizer: Any, tools: bool, calls: bool) -> None:
    """UserError, naming the template, when it cannot render the rows' tools (the same text with and without them,
    or it raises) or their calls (the call's name does not appear)."""
    user = [{"role": "user", "content": "hi"}]
    tool = [{"type": "function", "function": {"name": _PROBE, "description": "probe",
                                              "parameters": {"type": "object", "properties": {}}}}]
    if tools:
        plain = _probe(tokenizer, lambda t: _render(t, user, None, True))
        given = _probe(tokenizer, lambda t: _render(t, user, tool, True))
        if given is None or given == plain:
            why = "it raises" if given is None else "it renders the same text with and without them"
            raise UserError(f"{template_name(tokenizer)} cannot render tools ({why}), and the dataset's rows have "
                            "'tools'; "
                            "use a model whose template renders tools (Qwen2.5, Qwen3, Llama 3.1, SmolLM3, ...)")
    if calls:
        text = _probe(tokenizer, lambda t: _render(t, [*user, _probe_call()], tool if tools else None, False))
        if text is None or _PROBE not in text:
            raise UserError(f"{template_name(tokenizer)} cannot render tool calls (an assistant turn's "
                            f"'tool_calls' {'make it raise' if text is None else 'do not appear in its text'}), "
                            "and the dataset's conversations have them; use a model whose template renders tool "
                            "calls (Qwen2.5, Qwen3, Llama 3.1, SmolLM3, ...)")


def renderer_for(tokenizer: Any, reasoning: str, assistant_only: bool) -> Renderer:
    """The job's renderer, `reasoning: auto` resolved from what the template does."""
    native = renders_reasoning(tokenizer)
    resolved = ("keep" if native else "drop") if reasoning == "auto" else reasoning
    return Renderer(tokenizer, resolved, assistant_only, native, reasoning)


@dataclass
class _Span:
    start: int
    end: int
    reasoning: tuple[int, int] | None = None  # characters of the reasoning inside it, when it is masked


@dataclass
class Renderer:
    """How a job's conversations become tokens and a mask: its tokenizer, what to do with reasoning (keep, mask or
    drop: `auto` resolved by the caller), and whether only assistant turns are trained (train_on_completions)."""

    tokenizer: Any
    reasoning: str
    assistant_only: bool = True
    native_reasoning: bool = False  # the template renders reasoning_content itself

    requested: str = "auto"  # the job's reasoning option, before auto was resolved

    def check(self, examples: list[dict[str, Any]]) -> list[str]:
        """UserError when the template cannot render the examples' tools or calls; the notes to log about
        their reasoning."""
        check_tools(self.tokenizer, any(e.get("tools") for e in examples),
                    any("tool_calls" in m for e in examples for m in e["messages"]))
        thinking = sum(1 for e in examples for m in e["messages"] if m.get("reasoning_content"))
        if not thinking:
            return []
        if self.requested == "auto" and self.reasoning == "drop":
            return [f"reasoning: auto: {template_name(self.tokenizer)} does not render reasoning, so the reasoning "
                    f"of {thinking} assistant turn(s) is dropped; set reasoning: keep (or mask) to train on it (or "
                    "keep it in context) as <think>...</think> before the reply"]
        how = "as the template renders it" if self.native_reasoning else "as <think>...</think> before the reply"
        return [f"reasoning: {self.requested} ({self.reasoning}): {thinking} assistant turn(s) with reasoning, "
                + ("stripped" if self.reasoning == "drop" else how
                   + (", in context without loss" if self.reasoning == "mask" else ", trained on"))]

    def tokenise(self, examples: list[dict[str, Any]], rows: list[Any]) -> tuple[list[dict[str, Any]], list[str]]:
        """The token rows of the examples, in order, and one line per example that cannot be rendered, naming
        its row (`rows`: each example's Row)."""
        out: list[dict[str, Any]] = []
        problems: list[str] = []
        for example, row in zip(examples, rows, strict=True):
            try:
                out.extend(self.rows(example))
            except RowProblem as exc:
                problems.append(f"{row.where()} {exc}")
        return out, problems

    def _form(self, message: dict[str, Any]) -> dict[str, Any]:
        """A turn as templates take it: arguments as objects (they `tojson` them), no `weight`, and the reasoning
        kept, dropped or written into the content as the job says."""
        out = {k: v for k, v in message.items() if k not in ("weight", "reasoning_content")}
        if "tool_calls" in message:
            out["tool_calls"] = [{**c, "function": {**c["function"],
                                                    "arguments": json.loads(c["function"]["arguments"])}}
                                 for c in message["tool_calls"]]
        reasoning = message.get("reasoning_content")
        if reasoning and self.reasoning != "drop":
            if self.native_reasoning:
                out["reasoning_content"] = reasoning
            else:
                out["content"] = _THINK.format(reasoning) + (message.get("content") or "")
        return out

    def rows(self, example: dict[str, Any]) -> list[dict[str, list[int]]]:
        """The tokenised rows of one {"messages", "tools"?} example (more than one where the template rewrites a
        turn once later turns follow; see the module); RowProblem when the template cannot render it."""
        messages = example["messages"]
        forms = [self._form(m) for m in messages]
        tools = example.get("tools")
        # Tool results and schemas are never the model's to write, and a weight says which turns to learn: such
        # rows are trained on their assistant turns even without train_on_completions.
        per_turn = self.assistant_only or bool(tools) or any(
            m["role"] == "tool" or "weight" in m for m in messages)
        try:
            if not per_turn:
                return [self._tokens(_render(self.tokenizer, forms, tools, False), [], messages, whole=True)]
            trained = [i for i, m in enumerate(messages) if m["role"] == "assistant" and m.get("weight", 1)]
            return self._split(forms, tools, trained, messages)
        except RowProblem:
            raise
        except Exception as exc:  # a template's raise_exception (Llama 3.1: one call per turn)
            raise RowProblem(f"cannot be rendered by {template_name(self.tokenizer)}: {exc}") from None

    def _split(self, forms: list[dict[str, Any]], tools: Any, trained: list[int],
               messages: list[dict[str, Any]]) -> list[dict[str, list[int]]]:
        out = []
        end = len(forms)
        while trained:
            whole = _render(self.tokenizer, forms[:end], tools, False)
            spans, moved = [], []
            for i in trained:
                before = _render(self.tokenizer, forms[:i], tools, True)
                through = _render(self.tokenizer, forms[:i + 1], tools, False)
                if not through.startswith(before):
                    raise RowProblem(f"cannot be trained turn by turn with {template_name(self.tokenizer)}: its "
                                     f"generation prompt is not where assistant turn {i + 1} begins")
                if whole.startswith(through):
                    spans.append(self._span(messages[i], forms[i], through, len(before)))
                else:
                    moved.append(i)
            if spans:  # a pass whose turns all moved makes no row
                out.append(self._tokens(whole, spans, messages))
            trained, end = moved, (moved[-1] + 1 if moved else end)
        return out

    def _span(self, message: dict[str, Any], form: dict[str, Any], text: str, start: int) -> _Span:
        span = _Span(start, len(text))
        reasoning = message.get("reasoning_content")
        if self.reasoning == "mask" and reasoning:
            at = text.find(reasoning.strip(), start)
            if at < 0:
                raise RowProblem(f"cannot mask its reasoning: {template_name(self.tokenizer)} does not render the "
                                 "reasoning of its assistant turns as given")
            span.reasoning = (at, at + len(reasoning.strip()))
        return span

    def _tokens(self, text: str, spans: list[_Span], messages: list[dict[str, Any]],
                whole: bool = False) -> dict[str, list[int]]:
        """The text's tokens, and 1 for each token that starts inside a trained span (all of them, when not only
        the assistant's turns are trained) and outside a masked reasoning."""
        encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, starts = list(encoded["input_ids"]), [a for a, _ in encoded["offset_mapping"]]
        if not whole:
            trained = [(s.start, s.end) for s in spans]
            hidden = [s.reasoning for s in spans if s.reasoning is not None]
        else:
            trained, hidden = [(0, len(text))], self._reasoning_spans(text, messages)  # every token but reasoning
        mask = [int(any(a <= c < b for a, b in trained) and not any(a <= c < b for a, b in hidden)) for c in starts]
        return {"input_ids": ids, "assistant_masks": mask}

    def _reasoning_spans(self, text: str, messages: list[dict[str, Any]]) -> list[tuple[int, int]]:
        """Under train_on_completions false and reasoning mask: each reasoning's characters, in order."""
        if self.reasoning != "mask":
            return []
        out, at = [], 0
        for m in messages:
            reasoning = (m.get("reasoning_content") or "").strip()
            found = text.find(reasoning, at) if reasoning else -1
            if found >= 0:
                out.append((found, found + len(reasoning)))
                at = found + len(reasoning)
        return out
