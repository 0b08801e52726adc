"""A recipe's first rows, made in a child process (issue 43): `tunestudio data make --preview N` and
POST /api/data/preview both come here. Documents are read and the teacher asked in `python -m
tunestudio.worker.make_data`, never in the calling process (a broken PDF must not take the server down); the key
travels on the child's stdin, never in its arguments or environment. Nothing is written.

The child is killed past its bound: the teacher's deadline for each row asked plus PREVIEW_SLACK_S, at most
`limit_s`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from tunestudio.make_data_config import MakeDataConfig

__all__ = ["PREVIEW_SLACK_S", "PreviewFailed", "make_preview"]

PREVIEW_SLACK_S = 60.0  # the child's bound beyond the teacher's own deadlines (its start, reading the documents)


class PreviewFailed(Exception):
    """The preview made no answer; `code`: "timeout", or "failed" (the message says why, without internals)."""

    def __init__(self, message: str, code: str = "failed") -> None:
        super().__init__(message)
        self.code = code


def make_preview(cfg: MakeDataConfig, rows: int, limit_s: float | None = None) -> dict[str, list[dict[str, Any]]]:
    """{"rows": the rows kept (messages, provenance), "removed": [{removed_by, key, why, text}]} for the recipe's
    first `rows` requests (validated, resolved and keyed by the caller). Raises PreviewFailed."""
    given = json.dumps({"public": cfg.public_dict(), "secrets": cfg.secrets(), "rows": rows})
    bound = cfg.timeout * (rows + 1) + PREVIEW_SLACK_S
    bound = bound if limit_s is None else min(bound, limit_s)
    try:
        done = subprocess.run([sys.executable, "-m", "tunestudio.worker.make_data"], input=given, text=True,
                              capture_output=True, timeout=bound, check=False)
    except subprocess.TimeoutExpired:  # run() kills the child
        raise PreviewFailed(f"the preview took longer than {bound:.0f} s and was stopped", "timeout") from None
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        last = done.stderr.strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
        raise PreviewFailed(f"the preview's process failed: {last[0][:500]}") from None
    if "error" in answer:
        raise PreviewFailed(answer["error"])
    made = answer["rows"]
    return {"rows": [r for r in made if "removed_by" not in r], "removed": [r for r in made if "removed_by" in r]}
