"""The prompts a judgement asks: a job's held-out rows (its evaluation's prompts), or a prompt file.

A prompt file is `.txt` (one prompt per non-empty line), `.jsonl` or `.json` (a list): each row a string, or
an object with `prompt`, `question`, `instruction` (with `input` appended), or `messages` (the last user
turn). A row that has none of them is refused with its file and row number.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MAX_PROMPTS = 1000
MAX_FILE_BYTES = 20_000_000


class PromptsError(ValueError):
    pass


def held_out(result: dict[str, Any] | None) -> list[str]:
    """The prompts of the held-out rows the job's evaluation answered (none when it had no evaluation)."""
    evaluation = (result or {}).get("evaluation") or {}
    return [str(e["prompt"]) for e in evaluation.get("examples") or [] if isinstance(e, dict) and e.get("prompt")]


def _prompt(row: Any) -> str | None:
    if isinstance(row, str):
        return row.strip() or None
    if not isinstance(row, dict):
        return None
    for key in ("prompt", "question"):
        if isinstance(row.get(key), str) and row[key].strip():
            return row[key].strip()
    if isinstance(row.get("instruction"), str) and row["instruction"].strip():
        extra = row.get("input")
        return row["instruction"].strip() + (f"\n\n{extra.strip()}" if isinstance(extra, str) and extra.strip() else "")
    messages = row.get("messages")
    if isinstance(messages, list):
        users = [m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        if users and isinstance(users[-1], str) and users[-1].strip():
            return users[-1].strip()
    return None


def read(path: Path) -> list[str]:
    """The file's prompts; PromptsError naming the file (and row) when it cannot be read."""
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise PromptsError(f"{path}: larger than {MAX_FILE_BYTES // 1_000_000} MB")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PromptsError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptsError(f"{path}: cannot be read ({type(exc).__name__})") from None
    if path.suffix == ".txt":
        rows: list[Any] = [line for line in text.splitlines() if line.strip()]
        numbers = [i + 1 for i, line in enumerate(text.splitlines()) if line.strip()]
    elif path.suffix == ".json":
        try:
            rows = json.loads(text)
        except ValueError as exc:
            raise PromptsError(f"{path}: not JSON ({exc})") from None
        if not isinstance(rows, list):
            raise PromptsError(f"{path}: a JSON prompt file holds a list of prompts")
        numbers = list(range(1, len(rows) + 1))
    elif path.suffix == ".jsonl":
        rows, numbers = [], []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except ValueError:
                raise PromptsError(f"{path}, row {number}: not JSON") from None
            numbers.append(number)
    else:
        raise PromptsError(f"{path}: a prompt file is .txt, .jsonl or .json")
    prompts = []
    for number, row in zip(numbers, rows, strict=True):
        prompt = _prompt(row)
        if prompt is None:
            raise PromptsError(f"{path}, row {number}: no prompt (a string, or an object with prompt, question, "
                               "instruction or messages)")
        prompts.append(prompt)
    if not prompts:
        raise PromptsError(f"{path}: no prompts")
    if len(prompts) > MAX_PROMPTS:
        raise PromptsError(f"{path}: {len(prompts)} prompts; at most {MAX_PROMPTS} a judgement")
    return prompts
