"""A loopback port that refuses connections, for tests of an unreachable endpoint."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def refused_port() -> Iterator[int]:
    """A port on 127.0.0.1 that refuses every connection while the block lasts: bound and never listening, so no
    other process can take it meanwhile (a port closed after a probe can be), and no connection can reach itself
    through it (an outgoing connection's own port is never one bound here)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]
