"""Reaching the model/dataset hub, and saying clearly when it cannot be reached.

`huggingface_hub` retries an unreachable hub for about 45 s before it gives up
with a generic message. We first look in the local cache, then probe the hub
with one short TCP connect, and fail at once with an error naming what was
asked for when the hub is not there.
"""

from __future__ import annotations

import os
import socket
from functools import cache
from urllib.parse import urlparse

from tunestudio.worker.errors import UserError

PROBE_TIMEOUT_S = 3.0


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


@cache
def hub_reachable() -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return False
    url = urlparse(hub_endpoint())
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "", port), timeout=PROBE_TIMEOUT_S):
            return True
    except OSError:
        return False


def require_hub(what: str, name: str) -> None:
    """Raise UserError unless the hub answers; `what` is "model" or "dataset"."""
    if not hub_reachable():
        raise UserError(
            f"{what} {name!r} is not a local path and not in the local cache, and the hub "
            f"({hub_endpoint()}) is unreachable. Give a local {what} folder, or connect to the hub."
        )


def looks_like_local_path(name: str) -> bool:
    """A hub id is "name" or "org/name"; anything else names a folder on disk."""
    return name.startswith(("/", "./", "../", "~")) or name.count("/") > 1
