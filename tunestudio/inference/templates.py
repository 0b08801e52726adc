"""A chat model's template as its files hold it, read without transformers (the parent never imports it).

transformers 5 saves a tokenizer's template as `chat_template.jinja` beside `tokenizer_config.json`, and reads
that file before the config's `chat_template` (a text, or a list of named templates whose "default" is the one
`apply_chat_template` uses). The inference worker renders with what it loaded; this shows the same text.
"""

from __future__ import annotations

import json
from pathlib import Path

TEMPLATE_FILE = "chat_template.jinja"
CONFIG_FILE = "tokenizer_config.json"


def chat_template(tokenizer: str) -> tuple[str | None, str | None]:
    """(the template, the file it was read from) for a tokenizer folder; (None, None) when the folder has no
    template or is not a local folder (a hub id: the worker reads it from the cache)."""
    folder = Path(tokenizer)
    jinja = folder / TEMPLATE_FILE
    try:
        if jinja.is_file():
            return jinja.read_text(encoding="utf-8"), str(jinja)
        config = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None, None
    template = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(template, list):  # named templates: apply_chat_template's own is "default"
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return (template, str(folder / CONFIG_FILE)) if isinstance(template, str) and template else (None, None)
