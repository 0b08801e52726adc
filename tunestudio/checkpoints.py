"""Checkpoint folders (`checkpoint-N/`) in a job's output folder: which is the newest usable one.

Standard library only: the manager (parent) and the worker both ask.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def is_complete(path: str | Path) -> bool:
    """Whether a checkpoint folder holds a trainer state that parses (the trainer writes it last)."""
    try:
        json.loads((Path(path) / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return True


def latest_checkpoint(output_dir: str | None) -> str | None:
    """The highest complete checkpoint-N folder in output_dir, or None."""
    if not output_dir or not Path(output_dir).is_dir():
        return None
    found = []
    for path in Path(output_dir).iterdir():
        match = _CHECKPOINT.match(path.name)
        if match and is_complete(path):
            found.append((int(match.group(1)), path))
    return str(max(found)[1]) if found else None
