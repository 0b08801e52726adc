"""A scripted OpenAI-compatible teacher for the data-making tests (serve it with tests.helpers.server.loopback_v1).

Deterministic: a qa request is answered with a question naming the excerpt's first words and its first sentence
as the answer; a conversation with two such turns; an `answer` request with "Answer: <the prompt>". The model
name picks a script: "good"; "flaky" (each request's first try is a 429 with Retry-After 0, every third a 500
first); "garbage" (not JSON); "short" (a two-character answer); "same" (every reply alike); "hang" (no reply for
10 s); "slow" (0.3 s a reply); "401". CALLS counts the tries per model; KEYS holds the bearer keys it was sent.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler

CALLS: Counter[str] = Counter()
KEYS: set[str] = set()
_LOCK = threading.Lock()
_SEEN: set[str] = set()  # (model, request body) pairs already failed once by "flaky"


def _excerpt(text: str) -> str:
    found = re.search(r"<<<\n(.*?)\n>>>", text, re.S)
    return " ".join((found.group(1) if found else text).split())


def reply_for(body: dict) -> str:
    last = body["messages"][-1]["content"]
    if "<<<" not in last:
        return f"Answer: {last}"
    excerpt = _excerpt(last)
    sentence = excerpt.split(". ")[0].rstrip(".") + "."
    question = f"What does the handbook say about {' '.join(excerpt.split()[:6])}? (take {body.get('seed', 0)})"
    if "conversation" in last:
        return json.dumps({"messages": [{"role": "user", "content": question},
                                        {"role": "assistant", "content": sentence},
                                        {"role": "user", "content": "And is that always so?"},
                                        {"role": "assistant", "content": f"Yes, the handbook says: {sentence}"}]})
    return "```json\n" + json.dumps({"question": question, "answer": sentence}) + "\n```"


class Teacher(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        body = json.loads(raw)
        model = body["model"]
        with _LOCK:
            CALLS[model] += 1
            first = (model, raw.decode()) not in _SEEN
            _SEEN.add((model, raw.decode()))
            number = CALLS[model]
            KEYS.add(self.headers.get("Authorization", "").removeprefix("Bearer "))
        if model == "401":
            return self._send(401, {"error": {"message": "Incorrect API key provided"}})
        if model == "flaky" and first:
            if number % 3 == 0:
                return self._send(500, {"error": {"message": "the model is loading"}})
            return self._send(429, {"error": {"message": "slow down"}}, {"Retry-After": "0"})
        if model == "hang":
            time.sleep(10)
        if model == "slow":
            time.sleep(0.3)
        content = {"garbage": "{not json at all", "short": json.dumps({"question": "What is it?", "answer": "ok"}),
                   "same": json.dumps({"question": "What is the tram?", "answer": "The tram is a tram, always."})
                   }.get(model) or reply_for(body)
        self._send(200, {"choices": [{"message": {"role": "assistant", "content": content}}],
                         "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}})

    def _send(self, status: int, data: dict, headers: dict[str, str] | None = None) -> None:
        out = json.dumps(data).encode()
        self.send_response(status)
        for name, value in {"Content-Type": "application/json", "Content-Length": str(len(out)),
                            **(headers or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        with contextlib.suppress(OSError):  # the client gave up (a deadline, a cancel)
            self.wfile.write(out)
