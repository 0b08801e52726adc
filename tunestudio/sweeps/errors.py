"""What the sweeps' public face raises (no Optuna here: importing the face stays cheap)."""

from __future__ import annotations

LIVE = ("running", "stopping")  # a sweep's statuses while its runner works; then completed or stopped


class SweepNotFound(LookupError):
    def __init__(self, sweep_id: str) -> None:
        super().__init__(f"no sweep {sweep_id!r}")
        self.sweep_id = sweep_id


class SweepConflict(ValueError):
    """The sweep cannot do what was asked in its current status."""


class SecretsNeeded(SweepConflict):
    """A sweep whose base set secrets is without them: they are kept in memory only (never in the sweep's file),
    so a restarted server's sweep must be given them again before it makes another trial."""

    def __init__(self, fields: list[str], sweep_id: str | None = None) -> None:
        self.fields = fields
        where = f"/api/sweeps/{sweep_id}/resume" if sweep_id else "/api/sweeps/<id>/resume"
        body = ", ".join(f'"{name}": ...' for name in fields)
        super().__init__(f"the sweep's base set {', '.join(fields)}: secrets are kept in memory only, never in the "
                         f"sweep's file, and the server restarted since; give {'it' if len(fields) == 1 else 'them'} "
                         f"again (POST {where} {{{body}}}) to run its next trials")


class SecretRefused(ValueError):
    """A secret a sweep was given that its base never set (it would reach no trial)."""

    def __init__(self, field: str, sweep_id: str) -> None:
        super().__init__(f"{field}: sweep {sweep_id}'s base did not set {field}; give only the secrets it names")
        self.field = field
