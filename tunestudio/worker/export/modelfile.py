"""An Ollama Modelfile for an exported GGUF: its chat template as Ollama's TEMPLATE, and its stop tokens.

A Jinja chat template cannot be translated to a Go template in general, so
the template is *measured* instead: rendered with one message of each role
holding a sentinel, the text around the sentinel is that role's prefix and
suffix, and the text that `add_generation_prompt` appends opens the
assistant's turn. Those strings are written into a Go template over Ollama's
`.Messages`. A template that does not render this way (one that insists on
alternating roles, say) gets a plain one with a warning.

A vision-language model's projector GGUF is named by a second FROM line: Ollama
takes a GGUF with a vision tower and no text blocks as the model's projector,
and runs such a split model in its llama.cpp runner.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SENTINEL = "\x00TUNESTUDIO\x00"
ROLES = ("system", "user", "assistant")


def _render(tokenizer: Any, messages: list[dict[str, str]], generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def measure_template(tokenizer: Any) -> dict[str, Any] | None:
    """{header, roles: {role: (prefix, suffix)}, generation} measured from the chat template, or None."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    bos = getattr(tokenizer, "bos_token", None) or ""
    try:
        header = _render(tokenizer, [])
    except Exception:
        # Many templates refuse an empty conversation; what they all open with is at most the BOS text.
        try:
            header = bos if bos and _render(tokenizer, [{"role": "user", "content": "x"}]).startswith(bos) else ""
        except Exception:
            return None
    roles: dict[str, tuple[str, str]] = {}
    for role in ROLES:
        try:
            text = _render(tokenizer, [{"role": role, "content": SENTINEL}])
        except Exception:
            continue  # e.g. a template that wants a user turn first: that role is left out
        if text.count(SENTINEL) != 1 or not text.startswith(header):
            continue
        prefix, suffix = text[len(header):].split(SENTINEL)
        roles[role] = (prefix, suffix)
    if "user" not in roles:
        return None
    try:
        user_only = [{"role": "user", "content": SENTINEL}]
        generation = _render(tokenizer, user_only, True)[len(_render(tokenizer, user_only)):]
    except Exception:
        generation = ""
    if bos and header.startswith(bos) and _adds_bos(tokenizer):
        header = header[len(bos):]  # the tokenizer adds BOS itself, and so will llama.cpp (add_bos_token)
    return {"header": header, "roles": roles, "generation": generation}


def _adds_bos(tokenizer: Any) -> bool:
    bos_id = getattr(tokenizer, "bos_token_id", None)
    return bos_id is not None and tokenizer("a").input_ids[:1] == [bos_id]


def _go_literal(text: str) -> str:
    """Text inside a Go template: only "{{" would be read as an action."""
    return text.replace("{{", '{{ "{{" }}')


def go_template(measured: dict[str, Any]) -> str:
    """One line of actions, no whitespace trimming: the measured strings keep every newline they hold."""
    parts = [_go_literal(measured["header"]), "{{ range .Messages }}"]
    keyword = "if"
    for role, (prefix, suffix) in measured["roles"].items():
        action = f'{{{{ {keyword} eq .Role "{role}" }}}}'
        parts.append(f"{action}{_go_literal(prefix)}{{{{ .Content }}}}{_go_literal(suffix)}")
        keyword = "else if"
    parts.append("{{ end }}{{ end }}")
    parts.append(_go_literal(measured["generation"]))
    return "".join(parts)


def stop_tokens(tokenizer: Any, hf_dir: Path, measured: dict[str, Any] | None) -> list[str]:
    """EOS (from the tokenizer and the generation config) and every special token that ends a turn."""
    stops: list[str] = []
    eos = getattr(tokenizer, "eos_token", None)
    if eos:
        stops.append(eos)
    generation_config = hf_dir / "generation_config.json"
    if generation_config.is_file():
        ids = json.loads(generation_config.read_text(encoding="utf-8")).get("eos_token_id")
        for token_id in ids if isinstance(ids, list) else [ids] if ids is not None else []:
            stops.append(tokenizer.convert_ids_to_tokens(int(token_id)))
    special = set(getattr(tokenizer, "all_special_tokens", []))
    for _prefix, suffix in (measured or {}).get("roles", {}).values():
        stops.extend(token for token in special if token and token in suffix)
    return list(dict.fromkeys(s for s in stops if s))


def _quote(text: str) -> str:
    return '"""' + text + '"""' if "\n" in text or '"' in text else f'"{text}"'


def write_modelfile(hf_dir: Path, path: Path, gguf_name: str, projector: str | None = None) -> list[str]:
    """Write the Modelfile (with `projector`, the vision projector GGUF beside it); returns the warnings to
    report."""
    from transformers import AutoTokenizer

    warnings: list[str] = []
    tokenizer = AutoTokenizer.from_pretrained(str(hf_dir))
    measured = measure_template(tokenizer)
    lines = [f"FROM ./{gguf_name}", *([f"FROM ./{projector}"] if projector else []), ""]
    if measured is None:
        warnings.append("the model has no chat template that could be measured; the Modelfile uses a plain "
                        "\"{{ .Prompt }}\" template. Edit its TEMPLATE before chatting with it in Ollama.")
        lines.append('TEMPLATE """{{ .Prompt }}"""')
    else:
        lines.append('TEMPLATE """' + go_template(measured) + '"""')
    lines.append("")
    for stop in stop_tokens(tokenizer, hf_dir, measured):
        lines.append(f"PARAMETER stop {_quote(stop)}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return warnings
