"""Which rows a job held out for evaluation, by identity, so that its resume, its clones and its evaluations
use the same ones.

A row is known by `row_key`, a hash of its content as read (the parsed object, keys sorted): it survives a
re-ordered or concatenated file and any change of format, template, model or max_seq_length. Its place (file
and 1-based line, as an editor shows it) is kept for people and to pick the very same copy of a row that
appears more than once.

The record, `held_out.json` in the job's output folder (`FILE_NAME`), is written by the worker before training
starts, so a job stopped, interrupted or failed has one for its resume:

    {"version": 1, "seed": 3407, "source": null, "rows": [{"file": ..., "line": 12, "key": ...}, ...],
     "train_rows": 310, "data": "<hash of every usable row's key, order ignored>"}

A job whose `held_out_rows` names such a file holds out exactly its rows again (`reuse`). When the data
changed: every recorded row must still be among the usable rows, else the job fails naming the missing ones
(its evaluation would not be comparable with the first job's); rows added or removed elsewhere only train,
which the job says in a warning.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunestudio.worker.data.sources import Row
from tunestudio.worker.errors import UserError

__all__ = ["FILE_NAME", "Split", "read", "record", "reuse", "reuse_keys", "row_key", "write"]

FILE_NAME = "held_out.json"
VERSION = 1
_SHOWN = 5  # missing rows named in a message


def row_key(data: Any) -> str:
    """A row's identity: the hash of its content as read (keys sorted), not of its place."""
    text = json.dumps(data, sort_keys=True, ensure_ascii=False, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def _data_key(keys: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(sorted(keys)).encode("ascii")).hexdigest()[:32]


def _place(row: Row) -> dict[str, Any]:
    return {"file": row.source, "line": row.number}


@dataclass(frozen=True)
class Split:
    """Indices into the usable rows: those that train and those held out (each in the rows' order)."""

    train: list[int]
    held: list[int]
    note: str
    warning: str | None = None


def record(rows: Sequence[Row], held: Sequence[int], seed: int, source: str | None) -> dict[str, Any]:
    """The held_out.json of a split of the usable `rows` (held: their indices)."""
    keys = [row_key(r.data) for r in rows]
    return {
        "version": VERSION,
        "seed": seed,
        "source": source,
        "rows": [{**_place(rows[i]), "key": keys[i]} for i in held],
        "train_rows": len(rows) - len(held),
        "data": _data_key(keys),
    }


def write(path: Path, held_out: dict[str, Any]) -> None:
    path.write_text(json.dumps(held_out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def read(path: str | Path) -> dict[str, Any]:
    """A held_out.json, checked; UserError (naming held_out_rows) when it cannot be used."""
    try:
        found = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"held_out_rows: cannot read {path}: {exc}") from None
    rows = found.get("rows") if isinstance(found, dict) else None
    if (not isinstance(rows, list) or found.get("version") != VERSION
            or not all(isinstance(r, dict) and isinstance(r.get("key"), str) for r in rows)):
        raise UserError(f"held_out_rows: {path} is not a held-out record of tunestudio (a job's {FILE_NAME})")
    return found


def reuse(previous: dict[str, Any], rows: Sequence[Row], path: str | Path) -> Split:
    """The split of `rows` that holds out exactly the rows recorded in `previous` (read from `path`).

    A recorded row is matched at its own place first (file, line and content), then by content anywhere, so
    unchanged data gives the very same indices and a re-ordered file the same rows. Raises UserError naming the
    recorded rows that are not among `rows` any more.
    """
    return reuse_keys(previous, [row_key(r.data) for r in rows], [(r.source, r.number) for r in rows], path)


def reuse_keys(previous: dict[str, Any], keys: Sequence[str], places: Sequence[tuple[str, int]],
               path: str | Path) -> Split:
    """`reuse` of rows given by their keys and places (file, line): what the dataset report keeps of them.
    Only the recorded rows are looked up, so nothing the size of the data is built but the split."""
    wanted = previous["rows"]
    recorded: dict[tuple[Any, Any, str], list[int]] = {}  # (file, line, key) → the entries that name it
    for n, entry in enumerate(wanted):
        recorded.setdefault((entry.get("file"), entry.get("line"), entry["key"]), []).append(n)
    held: set[int] = set()
    matched: set[int] = set()
    for i, (place, key) in enumerate(zip(places, keys, strict=True)):
        if (entries := recorded.get((*place, key))) is not None:  # a place holds one row: its first entry
            held.add(i)
            matched.add(entries[0])
    unmatched = [entry for n, entry in enumerate(wanted) if n not in matched]
    needed = {entry["key"] for entry in unmatched}
    by_content: dict[str, list[int]] = {}
    for i, k in enumerate(keys if needed else ()):
        if k in needed and i not in held:
            by_content.setdefault(k, []).append(i)
    missing = []
    for entry in unmatched:
        free = by_content.get(entry["key"])
        if free:
            held.add(free.pop(0))
        else:
            missing.append(entry)
    if missing:
        named = "; ".join(f"{m.get('file')} row {m.get('line')}" for m in missing[:_SHOWN])
        more = f" and {len(missing) - _SHOWN} more" if len(missing) > _SHOWN else ""
        raise UserError(
            f"held_out_rows: the data changed since {path} was written: {len(missing)} of its {len(wanted)} "
            f"held-out rows are not among this job's usable rows any more ({named}{more}; changed, removed, or "
            "dropped or deduplicated by this config). Restore them to evaluate on the same rows, or unset "
            "held_out_rows for a new seeded split (its evaluation is then not comparable with that job's)")
    order = sorted(held)
    if len(order) == len(keys):
        raise UserError(f"held_out_rows: every usable row of this job is one of the {len(order)} rows {path} holds "
                        "out; nothing is left to train on")
    seed = previous.get("seed")
    note = (f"eval: held out the same {len(order)} rows as {path} (seed {seed}), of {len(keys)} usable rows")
    warning = None
    if _data_key(keys) != previous.get("data"):
        then = previous.get("train_rows")
        warning = (f"held_out_rows: the training rows changed since {path} was written ({len(keys) - len(order)} "
                   f"now, {then} then); the same {len(order)} rows are held out, the rest train")
    return Split(train=[i for i in range(len(keys)) if i not in held], held=order, note=note, warning=warning)
