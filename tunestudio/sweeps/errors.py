"""What the sweeps' public face raises (no Optuna here: importing the face stays cheap)."""

from __future__ import annotations

LIVE = ("running", "stopping")  # a sweep's statuses while its runner works; then completed or stopped


class SweepNotFound(LookupError):
    def __init__(self, sweep_id: str) -> None:
        super().__init__(f"no sweep {sweep_id!r}")
        self.sweep_id = sweep_id


class SweepConflict(ValueError):
    """The sweep cannot do what was asked in its current status."""
