"""A scripted OpenAI-compatible endpoint for tests (serve it with tests.helpers.server.loopback_v1): the request's
model name picks the script: a trickling reply, an oversized one, 429 then an answer, 500 then an answer, a
refused key, `say:<text>` answers <text>, ... Every other model gets a chat completion whose text is FINE. SEEN
records when each model's requests came; SENT how much an oversized script got out before the client hung up; KEYS
the Authorization header each model's last request carried."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler

FINE = "fine"
CHAT = {"choices": [{"message": {"role": "assistant", "content": FINE}}]}
HUGE = 64 * 1024 * 1024  # what the oversized scripts would send
SEEN: dict[str, list[float]] = defaultdict(list)  # the model -> when each of its requests came
SENT: dict[str, int] = {}  # the model -> the bytes its script got out before the client hung up
KEYS: dict[str, str | None] = {}  # the model -> the Authorization header its last request came with
SAY = "say:"  # a model named say:<text> answers <text>


class Scripted(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        model = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["model"]
        SEEN[model].append(time.monotonic())
        KEYS[model] = self.headers.get("Authorization")
        tries = len(SEEN[model])
        if model == "trickle":
            self._trickle()
        elif model in ("huge", "huge-declared"):
            self._huge(model, declared=model == "huge-declared")
        elif model == "429-then-ok" and tries == 1:
            self._send(429, {"error": {"message": "slow down"}}, {"Retry-After": "1"})
        elif model == "500-then-ok" and tries == 1:
            self._send(500, {"error": {"message": "the model is loading"}})
        elif model == "always-503":
            self._send(503, {"error": {"message": "overloaded"}})
        elif model == "401":
            self._send(401, {"error": {"message": f"Incorrect API key provided: {self.headers['Authorization']}"}})
        elif model == "403":
            self._send(403, {"error": {"message": "forbidden"}})
        elif model == "400":
            self._send(400, {"error": {"message": "no such model"}})
        elif model.startswith(SAY):
            self._send(200, {"choices": [{"message": {"role": "assistant", "content": model.removeprefix(SAY)}}]})
        else:
            self._send(200, CHAT)

    def _send(self, status: int, data: dict, headers: dict[str, str] | None = None) -> None:
        raw = json.dumps(data).encode()
        self.send_response(status)
        for name, value in {"Content-Type": "application/json", "Content-Length": str(len(raw)),
                            **(headers or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(raw)

    def _trickle(self) -> None:
        """A 200 whose body is a space every 0.2 s (for at most a minute: never for ever, even if nobody cuts it)."""
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Connection", "close")
        self.end_headers()
        try:
            for _ in range(300):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.2)
        except OSError:
            pass
        self.close_connection = True

    def _huge(self, model: str, declared: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if declared:
            self.send_header("Content-Length", str(HUGE))
        self.send_header("Connection", "close")
        self.end_headers()
        sent, chunk = 0, b" " * 65536
        try:
            while sent < HUGE:
                self.wfile.write(chunk)
                sent += len(chunk)
        except OSError:
            pass
        SENT[model] = sent
        self.close_connection = True
