"""The prompts a judgement asks: a job's held-out rows, or a prompt file.

The held-out rows are every row the job's final evaluation scored (its rows file, `eval_rows.json`, named in its
result's evaluation), a chat row as its whole conversation before the reference reply (system and earlier turns
kept); a job evaluated before there was a rows file gives its evaluation's shown examples (their last user turn).

A prompt file is `.txt` (one prompt per non-empty line), `.jsonl` or `.json` (a list): each row a string, or
an object with `prompt`, `question`, `instruction` (with `input` appended), or `messages` (the conversation up to
its last user turn: a reply after it is the reference, left out). A row that has none of them is refused with
its file and row number.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tunestudio.judge.core import Messages, Prompt

MAX_PROMPTS = 1000
MAX_FILE_BYTES = 20_000_000


class PromptsError(ValueError):
    pass


def held_out(result: dict[str, Any] | None) -> list[Prompt]:
    """The prompts of the job's held-out rows, at most MAX_PROMPTS (none when it had no evaluation)."""
    evaluation = (result or {}).get("evaluation") or {}
    rows = _rows_file(evaluation.get("rows_file"))
    if rows is None:  # evaluated before there was a rows file, or the file is gone: the shown examples
        return [str(e["prompt"]) for e in evaluation.get("examples") or [] if isinstance(e, dict) and e.get("prompt")]
    prompts: list[Prompt] = []
    for row in rows:
        prompt = _conversation(row.get("messages")) or _text(row.get("prompt"))
        if prompt is not None:  # a plain text row has no prompt to answer
            prompts.append(prompt)
    return prompts[:MAX_PROMPTS]


def _rows_file(path: Any) -> list[dict[str, Any]] | None:
    if not isinstance(path, str) or not path:
        return None
    try:
        body = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    rows = body.get("rows") if isinstance(body, dict) else None
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else None


def _text(value: Any) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


def _conversation(messages: Any) -> Messages | None:
    """The turns up to the last user turn (the replies after it are the reference); None when there is none."""
    if not isinstance(messages, list):
        return None
    turns = [{"role": str(m["role"]), "content": m["content"]} for m in messages
             if isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)]
    last = max((i for i, m in enumerate(turns) if m["role"] == "user" and m["content"].strip()), default=None)
    return None if last is None else turns[: last + 1]


def _prompt(row: Any) -> Prompt | None:
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
    return _conversation(row.get("messages"))


def read(path: Path) -> list[Prompt]:
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
