"""A scripted OpenAI-compatible teacher for the data-making tests (serve it with tests.helpers.server.loopback_v1).

Deterministic: a qa request is answered with a question naming the excerpt's first words and its first sentence
as the answer; a conversation with two such turns; an `answer` request with "Answer: <the prompt>". The model
name picks a script: "good"; "flaky" (each request's first try is a 429 with Retry-After 0, every third a 500
first); "garbage" (not JSON); "short" (a two-character answer); "same" (every reply alike); "hang" (no reply for
10 s); "slow" (0.3 s a reply); "inventive" (qa answers the excerpt does not state); "401". CALLS counts the tries
per model; KEYS holds the bearer keys it was sent, KEY_OF each model's last. The path under the port is not read:
`.../judge/v1` is the same server under another base_url.

Tools: a request with `tools` whose prompt asks about the weather in a Capitalised place gets a `get_weather` call
with {"city": place} ("badcall": {"town": place}, which the schema refuses; "textcall": the call as Hermes
`<tool_call>` text); any other prompt gets an answer. The judge's questions (tunestudio/worker/make_data/judging.py)
are told by their text, whatever the model: a score is 9 for a conversation whose assistant turns are all 40
characters or more, else 3 ("vague": no score at all); grounding is "yes" when every assistant sentence is in the
excerpt; the better of two answers is the longer ("sided": always "1"). An answer's second sample (seed above a
million) ends with a sentence more; the model "weak" always says "I do not know.".
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
KEY_OF: dict[str, str] = {}  # the model -> the bearer key its last request came with ("" without one)
_LOCK = threading.Lock()
_SEEN: set[str] = set()  # (model, request body) pairs already failed once by "flaky"


def _excerpt(text: str) -> str:
    found = re.search(r"<<<\n(.*?)\n>>>", text, re.S)
    return " ".join((found.group(1) if found else text).split())


def _assistant_turns(text: str) -> list[str]:
    block = re.search(r"Conversation:\n<<<\n(.*?)\n>>>", text, re.S)
    return re.findall(r"^assistant: (.*)$", block.group(1) if block else "", re.M)


def judged(body: dict) -> str | None:
    """The judge's verdict, when the request is one of its questions."""
    last, model = body["messages"][-1]["content"], body["model"]
    if last.startswith("Rubric:"):
        if model == "vague":
            return "It is quite good."
        return "Score: 9" if all(len(t) >= 40 for t in _assistant_turns(last)) else "Score: 3"
    if last.startswith("Excerpt:"):
        excerpt = _excerpt(last)
        said = [t.removeprefix("Yes, the handbook says: ") for t in _assistant_turns(last)]
        return "yes" if all(" ".join(t.split()).rstrip(".") in excerpt for t in said) else "no"
    if "Which answer is the better" in last:
        if model == "sided":
            return "1"
        first, second = re.findall(r"Answer \d:\n<<<\n(.*?)\n>>>", last, re.S)
        return "1" if len(first) > len(second) else "2" if len(second) > len(first) else "tie"
    return None


def tool_reply(body: dict) -> dict:
    prompt = body["messages"][-1]["content"]
    place = re.search(r"weather in ([A-Z][a-z]+)", prompt)
    if not place:
        return {"role": "assistant", "content": f"I can only look up the weather, not: {prompt}"}
    arguments = {"town" if body["model"] == "badcall" else "city": place.group(1)}
    if body["model"] == "textcall":
        return {"role": "assistant", "content": "<tool_call>" + json.dumps({"name": "get_weather",
                                                                            "arguments": arguments}) + "</tool_call>"}
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(arguments)}}]}


def reply_for(body: dict) -> str:
    last = body["messages"][-1]["content"]
    if body["model"] == "weak":
        return "I do not know."
    if "<<<" not in last:
        more = " That is all there is to it." if body.get("seed", 0) >= 1_000_000 else ""
        return f"Answer: {last}{more}"
    excerpt = _excerpt(last)
    sentence = excerpt.split(". ")[0].rstrip(".") + "."
    if body["model"] == "inventive":
        sentence = "The handbook was written by hand in 1850 on a boat."
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
            KEY_OF[model] = self.headers.get("Authorization", "").removeprefix("Bearer ")
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
        verdict = judged(body)
        if verdict is None and body.get("tools"):
            message = tool_reply(body)
        else:
            content = verdict or {"garbage": "{not json at all",
                                  "short": json.dumps({"question": "What is it?", "answer": "ok"}),
                                  "same": json.dumps({"question": "What is the tram?",
                                                      "answer": "The tram is a tram, always."})}.get(model)
            message = {"role": "assistant", "content": content or reply_for(body)}
        self._send(200, {"choices": [{"message": message}],
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
