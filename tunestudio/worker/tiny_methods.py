"""The bundled dataset's tasks in the shapes of the other training methods.

Separate from tiny.py on purpose: the Makefile rebuilds the tiny model whenever
tiny.py changes, and these files change nothing about the model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tunestudio.worker.tiny import DEFAULT_ROWS, DEFAULT_SEED, alpaca_user_text, make_rows


def _wrong_answer(rows: list[dict[str, str]], i: int) -> str:
    """A plausible wrong reply to row i: the next differing reply to the same task (else to any task)."""
    row = rows[i]
    others = rows[i + 1 :] + rows[:i]
    same_task = [r["output"] for r in others if r["instruction"] == row["instruction"] and r["output"] != row["output"]]
    return same_task[0] if same_task else next(r["output"] for r in others if r["output"] != row["output"])


def method_forms(rows: list[dict[str, str]]) -> dict[str, list[dict[str, Any]]]:
    """preference.jsonl (DPO, ORPO, KTO), unpaired.jsonl (KTO) and prompts.jsonl (GRPO: plain-text prompts, as
    the tiny model was pre-trained, with their answers); pretrain reads text.jsonl (tiny.write_dataset)."""

    def user(row: dict[str, str]) -> list[dict[str, str]]:
        return [{"role": "user", "content": alpaca_user_text(row)}]

    def reply(text: str) -> list[dict[str, str]]:
        return [{"role": "assistant", "content": text}]

    wrong = [_wrong_answer(rows, i) for i in range(len(rows))]
    return {
        "preference.jsonl": [{"prompt": user(r), "chosen": reply(r["output"]), "rejected": reply(w)}
                             for r, w in zip(rows, wrong, strict=True)],
        "unpaired.jsonl": [{"prompt": user(r), "completion": reply(r["output"] if i % 2 == 0 else wrong[i]),
                            "label": i % 2 == 0} for i, r in enumerate(rows)],
        "prompts.jsonl": [{"prompt": alpaca_user_text(r) + "\n", "answer": r["output"], "task": r["instruction"]}
                          for r in rows],
    }


def write_method_datasets(directory: str | Path, n: int = DEFAULT_ROWS, seed: int = DEFAULT_SEED) -> list[Path]:
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, items in method_forms(make_rows(n, seed)).items():
        path = out / name
        path.write_text("".join(json.dumps(item, ensure_ascii=False) + "\n" for item in items), encoding="utf-8")
        written.append(path)
    return written
