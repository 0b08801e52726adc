"""A dataset with known faults planted in it, for the dataset report and dedupe: exact and near duplicates,
over-long rows, refused rows, and an eval file whose rows partly repeat training rows.

Rows are alpaca rows of seeded random words (no two base rows share a word 3-gram by chance). Line numbers
are 1-based, as the report names them.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

MAX_SEQ_LENGTH = 256  # base rows are well under it with the tiny model's tokenizer, long rows well over


@dataclass
class Planted:
    train: Path
    eval: Path
    base: int  # distinct, well-formed, short rows
    exact: list[tuple[int, int]] = field(default_factory=list)  # (line of the copy, line of the original)
    near: list[tuple[int, int]] = field(default_factory=list)
    long: list[int] = field(default_factory=list)  # lines of rows over MAX_SEQ_LENGTH tokens
    refused: dict[int, str] = field(default_factory=dict)  # line → words its reason contains
    eval_exact: list[tuple[int, int]] = field(default_factory=list)  # (eval line, train line)
    eval_near: list[tuple[int, int]] = field(default_factory=list)

    @property
    def usable(self) -> int:
        return self.base + len(self.exact) + len(self.near) + len(self.long)


def write_planted(folder: Path, seed: int = 27) -> Planted:
    rng = random.Random(seed)
    vocabulary = sorted({"".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 7)))
                         for _ in range(4000)})
    words = lambda n: " ".join(rng.choice(vocabulary) for _ in range(n))  # noqa: E731
    fresh = lambda: {"instruction": words(6), "input": "", "output": words(24)}  # noqa: E731
    lines: list[str] = []
    planted = Planted(folder / "train.jsonl", folder / "eval.jsonl", base=40)

    def add(item: dict | str) -> int:
        lines.append(item if isinstance(item, str) else json.dumps(item))
        return len(lines)

    base = [fresh() for _ in range(planted.base)]
    at = [add(row) for row in base]  # lines 1..40
    for original in (2, 5, 5):  # exact: whitespace differs only
        row = base[original]
        copy = {**row, "instruction": "  " + row["instruction"].replace(" ", "   ") + " \n",
                "output": row["output"].replace(" ", "\t", 3)}
        planted.exact.append((add(copy), at[original]))
    for original in (10, 11):  # near: the last word of the answer changed
        row = base[original]
        planted.near.append((add({**row, "output": row["output"].rsplit(" ", 1)[0] + " zzzzz"}), at[original]))
    for _ in range(2):  # long: an answer of 300 words
        planted.long.append(add({"instruction": words(6), "input": "", "output": words(300)}))
    planted.refused[add('{"instruction": "broken", "output": ')] = "not valid JSON"
    planted.refused[add({"instruction": words(6), "input": ""})] = "'output'"
    planted.refused[add({"instruction": words(400), "input": "", "output": "x"})] = "fills max_seq_length"
    planted.train.write_text("\n".join(lines) + "\n", encoding="utf-8")

    evals: list[str] = []
    for original in (20, 21):
        row = base[original]
        evals.append(json.dumps({**row, "output": row["output"] + "  "}))
        planted.eval_exact.append((len(evals), at[original]))
    row = base[22]
    evals.append(json.dumps({**row, "output": row["output"].rsplit(" ", 1)[0] + " yyyyy"}))  # last word changed
    planted.eval_near.append((len(evals), at[22]))
    evals.extend(json.dumps(fresh()) for _ in range(3))
    planted.eval.write_text("\n".join(evals) + "\n", encoding="utf-8")
    return planted
