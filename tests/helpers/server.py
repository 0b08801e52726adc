"""A real uvicorn server on 127.0.0.1 for API tests, and a small SSE reader."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import uvicorn

from tests.helpers.wait import wait_until
from tunestudio.api import create_app
from tunestudio.jobs.manager import JobManager
from tunestudio.settings import Settings


@contextmanager
def running_server(settings: Settings, manager: JobManager | None = None) -> Iterator[str]:
    """Serve create_app(settings) on a free loopback port; yields the base URL."""
    app = create_app(settings, manager)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), 30, "the test server to start")
    if not server.started:
        raise RuntimeError("the test server did not start")
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


@contextmanager
def loopback_v1(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """A plain HTTP server of `handler` on a free loopback port (a scripted OpenAI-compatible endpoint); yields its
    /v1 base URL, and closes its listening socket after (else a later test meets its ResourceWarning)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@dataclass
class Sse:
    event: str
    data: str
    id: str | None
    retry: int | None = None

    def json(self) -> Any:
        return json.loads(self.data)


def read_sse(response: httpx.Response) -> Iterator[Sse]:
    """Parse a text/event-stream response into events (comments skipped)."""
    event, data, eid, retry = "message", [], None, None
    for line in response.iter_lines():
        if line == "":
            if data:
                yield Sse(event, "\n".join(data), eid, retry)
            event, data, eid, retry = "message", [], None, None
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
        elif name == "id":
            eid = value
        elif name == "retry":
            retry = int(value)
