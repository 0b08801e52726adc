"""Which start method a face's child gets (api/preview.py's, data_report/runner.py's): a fork of the warm worker
forkserver (`tunestudio.jobs.warm_context`), or a spawned interpreter when it gives none."""

from __future__ import annotations

from typing import Any

import pytest

import tunestudio.jobs
from tunestudio.jobs import prewarm


def record_start_method(monkeypatch: pytest.MonkeyPatch, used: list[str], cold: bool) -> None:
    """From now on each child's start method is appended to `used` ("forkserver" or "spawn"); cold=True: as if no
    forkserver were warm, so the child is spawned."""

    def watched() -> Any:
        ctx = None if cold else prewarm.ready_context()
        used.append(ctx.get_start_method() if ctx is not None else "spawn")
        return ctx

    monkeypatch.setattr(tunestudio.jobs, "warm_context", watched)
