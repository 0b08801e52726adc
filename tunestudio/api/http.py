"""How `tunestudio serve` runs uvicorn: a header read timeout and a cap on open connections.

uvicorn (0.55) closes idle keep-alive connections (timeout_keep_alive) and
caps the size of an incomplete request head (h11_max_incomplete_event_size),
but it waits for ever on a client that sends its request headers slowly, or
never: a few hundred such sockets would hold the server. The protocol below
closes a connection whose request head is not complete within
`header_timeout_seconds` of its first byte (or of the connection). Past
`max_connections` open connections, uvicorn answers 503 (limit_concurrency);
event streams count, so the default leaves room for many browser tabs.
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from tunestudio.settings import Settings

MAX_HEAD_BYTES = 64 * 1024  # request line and headers together


class HeaderTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol, plus: the request head must arrive within `header_timeout` seconds."""

    header_timeout = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        if self._waiting_for_head() and self._head_timer is None:
            self._arm_head_timer()  # the next request on a kept-alive connection starts arriving
        super().data_received(data)

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a request head was read whole
            self._disarm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def _waiting_for_head(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm_head_timer(self) -> None:
        self._disarm_head_timer()
        self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        timer = getattr(self, "_head_timer", None)
        if timer is not None:
            timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._waiting_for_head() and not self.transport.is_closing():
            self.logger.info("closing a connection whose request headers did not arrive within %.0f s",
                             self.header_timeout)
            self.transport.close()  # connection_lost tells h11


def server_config(app: Any, settings: Settings, host: str, port: int, **options: Any) -> uvicorn.Config:
    """The uvicorn config `tunestudio serve` runs with (tests use it too)."""
    protocol = type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,),
                    {"header_timeout": settings.header_timeout_seconds})
    return uvicorn.Config(
        app, host=host, port=port, http=protocol,
        limit_concurrency=settings.max_connections,
        timeout_keep_alive=5,
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        log_level="warning", **options,
    )
