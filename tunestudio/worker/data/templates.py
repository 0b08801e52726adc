"""Chat templates: the default for models that have none, and how many prompt
tokens a row's template puts before its first trained token."""

from __future__ import annotations

import contextlib
from typing import Any

# ChatML-shaped turns that end in the tokenizer's own EOS token, so a base model
# without a template learns to stop with a token it already has. Assistant
# turns sit inside {% generation %} markers, so TRL's assistant_only_loss can
# find them; the EOS that ends them is inside too and is trained on. The newline
# between turns opens the next turn, so a reply ends exactly at its EOS.
DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if not loop.first %}{{ '\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + eos_token }}{% endgeneration %}"
    "{% else %}{{ message['content'] + eos_token }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{% if messages %}{{ '\\n' }}{% endif %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}"
)


def ensure_chat_template(tokenizer: Any) -> str | None:
    """Give a tokenizer without a chat template the default one; returns the warning to show, or None."""
    if tokenizer.chat_template:
        return None
    tokenizer.chat_template = DEFAULT_CHAT_TEMPLATE
    return ("the model has no chat template; conversations are rendered with tunestudio's default "
            "ChatML-style template (<|im_start|>role ... EOS), which is saved with the result")


def _ids(encoded: Any) -> list[int]:
    return list(encoded["input_ids"])


def prompt_tokens(example: dict[str, Any], tokenizer: Any) -> int | None:
    """Tokens before the first token the row teaches (a completion or assistant turn); None for plain text."""
    if "prompt" in example:
        if isinstance(example["prompt"], list):
            return len(_ids(tokenizer.apply_chat_template(
                example["prompt"], add_generation_prompt=True, tokenize=True, return_dict=True)))
        return len(_ids(tokenizer(example["prompt"])))
    if "messages" in example:
        messages = example["messages"]
        first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
        if first == 0:
            return 0
        return len(_ids(tokenizer.apply_chat_template(
            messages[:first], add_generation_prompt=True, tokenize=True, return_dict=True)))
    return None


# --- long rows ---------------------------------------------------------------------
DEFAULT_TOKEN_CHARS = 64  # without a tokenizer: a generous bound on the characters one token covers


def text_budget(tokenizer: Any, max_seq_length: int) -> int:
    """Characters that hold at least max_seq_length tokens of any text: that many times the longest token.

    A token's string in the vocabulary is at least as long as the text it stands for (byte-level BPE writes
    a character per byte; SentencePiece byte tokens read <0x41>), so cutting a row to this many characters
    never takes away a token that training would keep: TRL keeps the first max_seq_length tokens.
    """
    longest = DEFAULT_TOKEN_CHARS
    if tokenizer is not None:
        with contextlib.suppress(AttributeError, NotImplementedError, TypeError):  # no vocabulary to read
            longest = max((len(token) for token in tokenizer.get_vocab()), default=DEFAULT_TOKEN_CHARS)
    return max_seq_length * max(longest, 1)


def _text_length(example: dict[str, Any]) -> int:
    total = 0
    for value in example.values():
        if isinstance(value, str):
            total += len(value)
        elif isinstance(value, list):
            total += sum(len(m["content"]) for m in value if isinstance(m, dict) and isinstance(m.get("content"), str))
    return total


def clip_example(example: dict[str, Any], budget: int) -> tuple[dict[str, Any], bool]:
    """The example with its text cut to `budget` characters in reading order (prompt before completion);
    turns past the budget keep their role with empty content. Returns (example, whether it was cut).

    Cut as text, before any tokenizer sees it: a 50 MB row must not become 50 million token ids.
    """
    if _text_length(example) <= budget:
        return example, False
    left = budget
    out: dict[str, Any] = {}
    for key in ("text", "prompt", "completion", "messages"):
        value = example.get(key)
        if isinstance(value, str):
            out[key], left = value[:left], left - min(len(value), left)
        elif isinstance(value, list):
            turns = []
            for turn in value:
                content = turn.get("content") if isinstance(turn, dict) else None
                if isinstance(content, str):
                    turn = {**turn, "content": content[:left]}
                    left -= min(len(content), left)
                turns.append(turn)
            out[key] = turns
    return {**example, **out}, True
