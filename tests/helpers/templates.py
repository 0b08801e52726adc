"""Chat templates tests set on a tokenizer or write beside a model."""

from __future__ import annotations

# The embedded tiny model's template before it learnt tools (worker/tiny.py): role tags, an assistant turn in
# {% generation %} markers, and nothing for tools, calls or results. A template that cannot call tools.
PLAIN_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] }}<|end|>{% endgeneration %}"
    "{% else %}{{ message['content'] }}<|end|>{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
