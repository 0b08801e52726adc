"""Errors the user can act on. The worker reports these as `Failed` with the
message alone; anything else is a bug and carries its traceback."""

from __future__ import annotations


class UserError(Exception):
    """Something in the job's input (model, data, config) that the user must fix."""
