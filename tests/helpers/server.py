"""A real uvicorn server on 127.0.0.1 for API tests, and a small SSE reader."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
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
