"""The bundled reward-model pairs: a lookup question of the bundled dataset, its right answer chosen, a wrong answer
of the same kind rejected (another colour, another animal's sound, another French word...).

Separate from tiny.py on purpose, as tiny_methods.py is: the Makefile rebuilds the tiny model whenever tiny.py
changes, and these files change nothing about the model.

The tiny model learns lookups, not copying (tiny.py): the bundled preference.jsonl's rejected answers are mostly of
other tasks, which a reward model tells apart by the kind of word alone; here both answers are of the question's
kind, so the head must learn which answer goes with which question. The held-out pairs (reward_pairs_eval.jsonl)
ask the same closed set of questions as training (the lookup tables are small), but no (question, chosen,
rejected) triple of theirs trains: each pits a question's right answer against a wrong one it was never paired with
for that question in training.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from tunestudio.worker.tiny import COLOURS, FRENCH, NUMBERS, OPPOSITES, SOUNDS, alpaca_user_text, make_rows

TRAIN_PAIRS = 600
EVAL_PAIRS = 100
SEED = 4321

# Every answer a task can give: a wrong answer is another of them.
_ANSWERS: dict[str, tuple[str, ...]] = {
    "Write the opposite of the word.": tuple(sorted({w for pair in OPPOSITES for w in pair})),
    "What colour is it?": tuple(sorted({c for _, c in COLOURS})),
    "What sound does this animal make?": tuple(s for _, s in SOUNDS),
    "Translate the word into French.": tuple(f for _, f in FRENCH),
    "What number comes next?": NUMBERS[1:],
}


def _pair(row: dict[str, str], rng: random.Random) -> dict[str, Any]:
    wrong = rng.choice([a for a in _ANSWERS[row["instruction"]] if a != row["output"]])
    return {"prompt": [{"role": "user", "content": alpaca_user_text(row)}],
            "chosen": [{"role": "assistant", "content": row["output"]}],
            "rejected": [{"role": "assistant", "content": wrong}]}


def _key(pair: dict[str, Any]) -> tuple[str, str, str]:
    return pair["prompt"][0]["content"], pair["chosen"][0]["content"], pair["rejected"][0]["content"]


def reward_pairs(n_train: int = TRAIN_PAIRS, n_eval: int = EVAL_PAIRS,
                 seed: int = SEED) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(training pairs, held-out pairs), deterministic; no held-out triple is a training triple."""
    rng = random.Random(seed)
    train = [_pair(row, rng) for row in make_rows(n_train, seed)]
    seen = {_key(p) for p in train}
    held: list[dict[str, Any]] = []
    for row in make_rows(n_eval * 20, seed + 1):
        if len(held) >= n_eval:
            break
        pair = _pair(row, rng)
        if _key(pair) not in seen:
            seen.add(_key(pair))
            held.append(pair)
    return train, held


def write_reward_datasets(directory: str | Path) -> list[Path]:
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    train, held = reward_pairs()
    written = []
    for name, items in (("reward_pairs.jsonl", train), ("reward_pairs_eval.jsonl", held)):
        path = out / name
        path.write_text("".join(json.dumps(item, ensure_ascii=False) + "\n" for item in items), encoding="utf-8")
        written.append(path)
    return written
