"""A chat request's prompt: its chat template applied, with the request's tools, and a call begun when one must come.

`chat_prompt` renders the turns (and `tools`) with the tokenizer's own template, as the job trained on them. When
the request has tools or its turns hold calls, the template must be one that calls tools (`tunestudio.tool_calls`
reads its family from the text; others answer 400 saying so), and it must have written every function's name into
the prompt (a template that drops `tools` silently is refused too). Under `tool_choice` required or a named
function the reply is begun here with the family's call opener (and the name): those tokens follow the generation
prompt, as guided decoding begins an answer, so the model writes the rest of a call rather than being hoped to
start one. The opener goes back to the parent (`Started.prefix`), which reads it as the output's first words.

An image model's prompt comes from its processor instead (serve/vision.py, loaded only then): its images decoded
and its chat template applied give the ids and the model's other inputs (`Prompt.inputs`: pixel values); the rest
(tools, openers, thinking) is read from its text tokenizer as for any model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tunestudio.inference_protocol import ImageInput, Tools
from tunestudio.tool_calls import NO_TOOLS, THINK, Family, Harmony, detect, thinks
from tunestudio.worker.errors import UserFacing


@dataclass(frozen=True)
class Prompt:
    """The prompt's token ids (the opener's included) and how to read the output: the family (None: no calls are
    read), whether the template thinks and the prompt ended inside `<think>`, the opener the reply begins with, and
    the special tokens the output must keep when decoded (the family's markers); `inputs`: the model's inputs
    besides the ids (an image model's pixel values and the like; empty for text)."""

    ids: list[int]
    family: Family | None = None
    think: bool = False
    think_open: bool = False
    prefix: str = ""
    keep: tuple[str, ...] = ()
    inputs: dict[str, Any] = field(default_factory=dict)


def text_tokenizer(tokenizer: Any) -> Any:
    """The text tokenizer: an image model's processor's own, or the tokenizer itself."""
    return tokenizer.tokenizer if hasattr(tokenizer, "image_processor") else tokenizer


def _template(tokenizer: Any) -> str | None:
    return tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None


def prompt_ids(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
    """The prompt as the job trained on it: its chat template, or (a job without one) the turns' plain text."""
    if tokenizer.chat_template:
        try:
            encoded = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                                    tokenize=True, return_dict=True)
        except Exception as exc:  # jinja raises its own errors for conversations a template refuses
            raise UserFacing(f"messages: the model's chat template refuses this conversation: {exc}",
                             400, "invalid_messages") from None
        return list(encoded["input_ids"])
    return list(tokenizer("\n".join(m.get("content") or "" for m in messages))["input_ids"])


def _has_calls(messages: list[dict[str, Any]]) -> bool:
    return any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)


def _encode(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
            images: Sequence[ImageInput]) -> tuple[list[int], dict[str, Any]]:
    """The prompt's ids and the model's other inputs: a processor's (images decoded) or the tokenizer's."""
    if text_tokenizer(tokenizer) is not tokenizer:
        from tunestudio.worker.serve.vision import processor_prompt

        return processor_prompt(tokenizer, messages, images, tools)
    if images:
        raise UserFacing(f"{images[0].where}: this model is a text model; it reads no images", 400,
                         "image_not_supported", param=images[0].where)
    return prompt_ids(tokenizer, messages, tools), {}


def chat_prompt(tokenizer: Any, messages: list[dict[str, Any]], tools: Tools | None = None,
                images: Sequence[ImageInput] = ()) -> Prompt:
    """The prompt of a chat request, and how to read its output (see the module's notes). `tokenizer`: the
    model's tokenizer, or an image model's processor. UserFacing (400) for a template that does not call tools
    when the request needs one that does, and for an image a model cannot read."""
    template = _template(tokenizer)
    think = thinks(template)
    family = detect(template) if tools is not None or _has_calls(messages) else None
    if family is None and (tools is not None or _has_calls(messages)):
        raise UserFacing(f"tools: {NO_TOOLS}; chat without tools, or fine-tune a model whose template calls them",
                         400, "tools_unsupported")
    ids, inputs = _encode(tokenizer, messages, tools.tools if tools is not None else None, images)
    tokenizer = text_tokenizer(tokenizer)
    if tools is not None:
        shown = tokenizer.decode(ids, skip_special_tokens=False)
        missing = [name for name in tools.names if name not in shown]
        if missing:
            raise UserFacing(f"tools: the model's chat template did not render the functions {missing} into the "
                             "prompt, so the model could not know them", 400, "tools_unsupported")
    prefix = ""
    if family is not None and tools is not None and tools.choice != "auto":
        prefix = family.opener(None if tools.choice == "required" else tools.choice)
        ids += tokenizer.encode(prefix, add_special_tokens=False)
    think_open = think and not prefix and tokenizer.decode(ids[-8:], skip_special_tokens=False).rstrip().endswith(
        THINK)
    if tools is None:  # no calls are read; but harmony's channels are read still, to split its analysis out
        family = detect(template) if isinstance(detect(template), Harmony) else None
    keep = (*(family.markers if family is not None else ()), *(("<think>", "</think>") if think else ()))
    return Prompt(ids, family, think, think_open, prefix, keep, inputs)
