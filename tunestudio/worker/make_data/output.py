"""The output file: rows appended as they come, each keyed by its source and index (`provenance.key`), so a run
killed at any point and run again neither loses nor repeats a row.

Before the first row, `<output>.recipe.json` is written beside it: the recipe (no key) and the teacher's identity
(base_url, model), and the studio's mark (`made_by`), without which the file is never written to
(make_data_config.check_output). A run that finds the file reads the keys it holds; a last line a kill cut in
half is cut off (the file is the studio's own), and its row is made again. `<output>.rejected.jsonl` gets a line
for each row a gate removed (key, gate, why, the text) and each failed call (key, error) as they come: a resume
does not ask a removed row's item again (the same seed would make it again), and does ask a failed call's.
`<output>.report.json` is written at the end: rows made, rows each gate removed with examples, the failed calls'
errors, requests and tokens.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from tunestudio.make_data_config import MakeDataConfig, check_output, recipe_file, rejected_file, report_file
from tunestudio.worker.errors import UserError

__all__ = ["Output"]


class Output:
    """The recipe's output file, open for appending; `rows` holds the rows it had when opened."""

    def __init__(self, cfg: MakeDataConfig) -> None:
        self.path = Path(cfg.output)
        try:
            check_output(cfg)  # again: the file may have appeared since the submit
        except ValueError as exc:
            raise UserError(str(exc)) from None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._mark(cfg)
        self.rows, self.torn = _read(self.path)
        self.keys = {row.get("provenance", {}).get("key") for row in self.rows}
        self.rejected_keys = {row.get("key") for row in _read(rejected_file(self.path))[0] if "gate" in row}
        self._file = self.path.open("a", encoding="utf-8")
        self._rejected = rejected_file(self.path).open("a", encoding="utf-8")

    def _mark(self, cfg: MakeDataConfig) -> None:
        """The recipe file: written (or its runs extended) before the output is touched."""
        path = recipe_file(self.path)
        try:
            runs = json.loads(path.read_text(encoding="utf-8")).get("runs", [])
        except (OSError, ValueError, AttributeError):
            runs = []
        runs.append({"started_at": time.time(), "recipe": cfg.public_dict()})
        record = {"made_by": "tunestudio", "output": str(self.path),
                  "teacher": {"base_url": cfg.teacher.base_url, "model": cfg.teacher.model},
                  "recipe": cfg.public_dict(), "runs": runs}
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, path)

    def append(self, row: dict[str, Any]) -> None:
        """One row, whole, on its own line, handed to the kernel at once (a SIGKILL after this keeps it)."""
        self._file.write(json.dumps(row, ensure_ascii=False) + "\n")
        self._file.flush()

    def reject(self, record: dict[str, Any]) -> None:
        """A removed row or a failed call, on its own line of the rejected file."""
        self._rejected.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._rejected.flush()

    def close(self) -> None:
        self._file.close()
        self._rejected.close()

    def report(self, report: dict[str, Any]) -> Path:
        path = report_file(self.path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        os.replace(tmp, path)
        return path


def _read(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The rows of one of the run's JSON lines files; a torn last line (a kill mid-write) is cut off the file."""
    if not path.exists():
        return [], 0
    raw = path.read_bytes()
    rows, good = [], 0
    for line in raw.splitlines(keepends=True):
        try:
            row = json.loads(line)
        except ValueError:
            break
        if not line.endswith(b"\n") or not isinstance(row, dict):
            break
        rows.append(row)
        good += len(line)
    if good < len(raw):
        with path.open("r+b") as file:
            file.truncate(good)
    return rows, len(raw) - good
