"""`tunestudio serve` as a user runs it: slow request heads are cut off, open connections are capped."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from ..helpers.wait import wait_until


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def serve(tmp_path: Path, **env: str) -> Iterator[int]:
    port = free_port()
    environ = {**os.environ, "TUNESTUDIO_HOME": str(tmp_path / "home"), "TUNESTUDIO_PREWARM": "0", **env}
    with subprocess.Popen([sys.executable, "-m", "tunestudio.cli", "serve", "--port", str(port)], env=environ,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        try:
            def up() -> bool:
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                try:
                    return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
                except httpx.TransportError:
                    return False

            wait_until(up, 60, "the server to answer", every=0.1)
            yield port
        finally:
            proc.terminate()
            proc.wait(30)


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes the connection within `seconds` (recv reads b"" at its close): a generous
    deadline, for a close nothing but the header timeout makes (uvicorn alone holds such a connection for ever)."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            if sock.recv(65536) == b"":
                return True
        except TimeoutError:
            return False
    return False


def test_a_slow_request_head_is_cut_off_and_a_normal_request_still_works(tmp_path: Path) -> None:
    with serve(tmp_path, TUNESTUDIO_HEADER_TIMEOUT_SECONDS="1") as port, \
            socket.create_connection(("127.0.0.1", port)) as silent, \
            socket.create_connection(("127.0.0.1", port)) as slow:
        # silent connects and says nothing; slow never ends its headers. Both are closed by the server, where
        # uvicorn alone would wait for ever.
        slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        assert closed_within(silent, 60) and closed_within(slow, 60)
        # A kept-alive connection gets the same bound for its next request head (uvicorn's own keep-alive
        # timeout stops counting at the first byte).
        with socket.create_connection(("127.0.0.1", port)) as kept:
            kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            kept.settimeout(10)
            assert kept.recv(4096).startswith(b"HTTP/1.1 200")
            kept.sendall(b"GET /healthz HTTP/1.1\r\n")
            assert closed_within(kept, 60)
        assert httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200


def test_connections_past_the_cap_are_answered_503(tmp_path: Path) -> None:
    with serve(tmp_path, TUNESTUDIO_MAX_CONNECTIONS="4", TUNESTUDIO_HEADER_TIMEOUT_SECONDS="60") as port:
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
        try:
            over = wait_until(lambda: httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 503,
                              10, "a 503 past the cap")
            assert over
        finally:
            for sock in idle:
                sock.close()
        wait_until(lambda: httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200, 10, "room again")
