"""One OpenAI-compatible client for every endpoint the studio asks: the judge now, a data-making teacher and the
arena later (parent side: httpx, no torch).

What a call may cost is bounded, whatever the endpoint does:
- **a total deadline per call** (`deadline_s`: connecting, sending, waiting, reading and every retry within it).
  httpx's timeouts bound each read, not the call, so an endpoint that sends a byte every few seconds would hold
  a caller for ever; a watch thread shuts the call's socket down when the deadline passes (or `cancel` is set),
  which wakes the blocked read at once.
- **a cap on the reply's size** (`max_reply_bytes`): the body is read in chunks and refused past the cap (or at
  once when its Content-Length says so), never read whole first.
- **retries with exponential backoff** (jittered) on 429 (its Retry-After honoured), 5xx and connection errors,
  as long as the next try still fits the deadline.
- **a refused key is named as such** (401, 403); the key is never in a message, a log or a return value (an
  endpoint's own error text that echoes it has it masked).
"""

from __future__ import annotations

import contextlib
import email.utils
import functools
import json
import random
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

__all__ = ["BACKOFF_S", "DEADLINE_S", "MAX_REPLY_BYTES", "RETRIES", "Cancelled", "ClientError", "DeadlineExceeded",
           "HttpStatusError", "KeyRefused", "Messages", "NotAChatCompletion", "OpenAIClient", "ReplyTooLarge",
           "Unreachable"]

DEADLINE_S = 120.0
MAX_REPLY_BYTES = 4 * 1024 * 1024
RETRIES = 4
BACKOFF_S = 0.5  # the first pause; it doubles each try, up to BACKOFF_MAX_S
BACKOFF_MAX_S = 30.0
CONNECT_S = 10.0  # a connection, at most (within the deadline): a cancel cannot cut a connect that is under way
ERROR_BODY_BYTES = 64 * 1024  # what is read of a refusal's body, for its message
WATCH_S = 0.05  # how often the watch looks at the clock and the cancel

Messages = list[dict[str, Any]]


class ClientError(RuntimeError):
    """A call that got no usable reply; the message says why in words a user can act on (never the key)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class DeadlineExceeded(ClientError):
    pass


class Cancelled(ClientError):
    pass


class ReplyTooLarge(ClientError):
    pass


class KeyRefused(ClientError):
    pass


class HttpStatusError(ClientError):
    pass


class Unreachable(ClientError):
    pass


class NotAChatCompletion(ClientError):
    pass


@functools.cache
def _tls() -> ssl.SSLContext:
    """httpx's default verification (certifi's roots, SSL_CERT_FILE/DIR honoured), made once: a client per call
    (the watch needs its own connection) would otherwise load the CA bundle each time, about 20 ms a call."""
    return httpx.create_ssl_context()


class _Watch:
    """Shuts a call's socket down when its deadline passes or its cancel is set (httpcore's `trace` extension
    hands over the socket as soon as it is connected)."""

    def __init__(self, until: float, cancel: threading.Event | None) -> None:
        self.until, self.cancel = until, cancel
        self.fired: str | None = None  # "deadline" or "cancel"
        self._socket: socket.socket | None = None
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="openai-client-watch", daemon=True)

    def __enter__(self) -> _Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def trace(self, name: str, info: Mapping[str, Any]) -> None:
        if name.endswith((".connect_tcp.complete", ".start_tls.complete")):  # TLS replaces the socket
            stream = info.get("return_value")
            sock = stream.get_extra_info("socket") if stream is not None else None
            with self._lock:
                self._socket = sock
            if self.fired:
                self._cut()

    def check(self) -> None:
        """Mark the deadline or the cancel now (between chunks), without waiting for the watch's next look."""
        if self.fired is None and self.cancel is not None and self.cancel.is_set():
            self.fired = "cancel"
        elif self.fired is None and time.monotonic() >= self.until:
            self.fired = "deadline"

    def _run(self) -> None:
        while not self._done.wait(max(0.0, min(WATCH_S, self.until - time.monotonic()))):
            self.check()
            if self.fired:
                self._cut()
                return

    def _cut(self) -> None:
        with self._lock:
            sock = self._socket
        if sock is not None:
            with contextlib.suppress(OSError):  # already closed: nothing left to wake
                sock.shutdown(socket.SHUT_RDWR)  # wakes a read blocked in another thread (close() would not)


class _Retry(Exception):
    """A try that may be repeated: its error, and how long the endpoint asked us to wait (Retry-After)."""

    def __init__(self, error: ClientError, after: float | None = None) -> None:
        super().__init__(str(error))
        self.error, self.after = error, after


@dataclass(frozen=True)
class OpenAIClient:
    """An OpenAI-compatible API at `base_url` (e.g. http://127.0.0.1:8765/v1); `name` is how messages call it."""

    base_url: str
    key: str | None = field(default=None, repr=False)
    deadline_s: float = DEADLINE_S
    max_reply_bytes: int = MAX_REPLY_BYTES
    retries: int = RETRIES
    backoff_s: float = BACKOFF_S
    name: str = "the endpoint"

    def chat(self, model: str, messages: Messages, cancel: threading.Event | None = None, **params: Any) -> str:
        """The first choice's text of a chat completion (params: temperature, max_tokens, ...)."""
        reply = self.post("chat/completions", {"model": model, "messages": messages, **params}, cancel)
        try:
            content = reply["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise NotAChatCompletion(f"{self._who} answered something that is not an OpenAI chat completion") from None
        return str(content or "")

    def post(self, path: str, body: Mapping[str, Any], cancel: threading.Event | None = None) -> Any:
        """POST `body` as JSON to `path` under the base URL; the reply's JSON, or a ClientError saying why not."""
        url = f"{self.base_url.rstrip('/')}/{path.lstrip('/')}"
        until = time.monotonic() + self.deadline_s
        tries = self.retries + 1
        for attempt in range(tries):
            if cancel is not None and cancel.is_set():
                raise self._stopped("cancel")
            try:
                raw = self._attempt(url, body, until, cancel)
            except _Retry as retry:
                if attempt == tries - 1:
                    said = f"{retry.error} ({tries} tries)" if tries > 1 else str(retry.error)
                    raise type(retry.error)(said, retry.error.status) from None
                self._pause(retry, attempt, until, cancel)
                continue
            try:
                return json.loads(raw)
            except ValueError:
                raise NotAChatCompletion(f"{self._who} answered something that is not JSON") from None
        raise AssertionError("unreachable")  # the loop returns or raises

    @property
    def _who(self) -> str:
        return f"{self.name} at {self.base_url}"

    def _attempt(self, url: str, body: Mapping[str, Any], until: float, cancel: threading.Event | None) -> bytes:
        """One try: the body of a 200 reply; _Retry for what may pass (429, 5xx, a broken connection)."""
        remaining = max(until - time.monotonic(), 0.001)
        headers = {"Accept-Encoding": "identity"}  # sizes counted as sent: no compressed bomb to unpack
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        watch = _Watch(until, cancel)
        try:
            with watch, httpx.Client(timeout=httpx.Timeout(remaining, connect=min(CONNECT_S, remaining)),
                                     verify=_tls()) as client, \
                    client.stream("POST", url, json=dict(body), headers=headers,
                                  extensions={"trace": watch.trace}) as response:
                if response.status_code == 200:
                    return self._read(response, self.max_reply_bytes, watch, strict=True)
                text = self._read(response, ERROR_BODY_BYTES, watch, strict=False)
                self._refused(response, text)  # raises
        except httpx.HTTPError as exc:
            watch.check()
            if watch.fired:  # our deadline or a cancel cut it
                raise self._stopped(watch.fired) from None
            if isinstance(exc, httpx.ConnectTimeout) and time.monotonic() < until:
                raise _Retry(Unreachable(f"{self._who} is unreachable (no connection within {CONNECT_S:g} s)")) \
                    from None
            if isinstance(exc, httpx.TimeoutException):  # every other wait was given what was left of the deadline
                raise self._stopped("deadline") from None
            raise _Retry(Unreachable(f"{self._who} is unreachable ({type(exc).__name__})")) from None
        raise AssertionError("unreachable")  # _refused raises

    def _read(self, response: httpx.Response, cap: int, watch: _Watch, strict: bool) -> bytes:
        """The body, chunk by chunk, stopping at the deadline, a cancel, or `cap` bytes (an error when strict)."""
        declared = response.headers.get("content-length", "")
        if strict and declared.isdigit() and int(declared) > cap:
            raise ReplyTooLarge(f"{self._who} sent a reply of {int(declared):,} bytes, over the cap of {cap:,} "
                                "bytes; it was not read")
        body = bytearray()
        for chunk in response.iter_bytes():
            body += chunk
            watch.check()
            if watch.fired:
                raise self._stopped(watch.fired)
            if len(body) > cap:
                if strict:
                    raise ReplyTooLarge(f"{self._who} sent a reply over the cap of {cap:,} bytes; it was cut "
                                        f"after {len(body):,} bytes")
                return bytes(body[:cap])
        watch.check()
        if watch.fired:  # a shut-down socket ends a body sent until close like any end: not a whole reply
            raise self._stopped(watch.fired)
        return bytes(body)

    def _stopped(self, why: str) -> ClientError:
        if why == "cancel":
            return Cancelled(f"the call to {self._who} was cancelled")
        return DeadlineExceeded(f"{self._who} did not answer within its deadline of {self.deadline_s:g} s")

    def _refused(self, response: httpx.Response, text: bytes) -> None:
        status, said = response.status_code, self._mask(_error_text(text))
        if status in (401, 403):
            what = "the key was refused" if self.key else "it wants a key and none was given"
            raise KeyRefused(f"{self._who} answered HTTP {status}: {what} ({said})", status)
        error = HttpStatusError(f"{self._who} answered HTTP {status}: {said}", status)
        if status == 429 or status >= 500:
            raise _Retry(error, _retry_after(response.headers.get("retry-after")))
        raise error

    def _pause(self, retry: _Retry, attempt: int, until: float, cancel: threading.Event | None) -> None:
        """Wait before the next try: the endpoint's Retry-After, else a jittered doubling backoff; give up with the
        last error when the wait would pass the deadline."""
        backoff = min(BACKOFF_MAX_S, self.backoff_s * 2 ** attempt) * random.uniform(0.5, 1.0)
        delay = retry.after if retry.after is not None else backoff
        if time.monotonic() + delay >= until:
            asked = " (its Retry-After)" if retry.after is not None else ""
            raise type(retry.error)(f"{retry.error}; {attempt + 1} tries, and the next, in {delay:.1f} s{asked}, "
                                    f"would pass the deadline of {self.deadline_s:g} s", retry.error.status)
        if cancel is not None:
            if cancel.wait(delay):
                raise Cancelled(f"the call to {self._who} was cancelled")
        else:
            time.sleep(delay)

    def _mask(self, text: str) -> str:
        return text.replace(self.key, "***") if self.key else text


def _error_text(raw: bytes) -> str:
    """An OpenAI error's message ({"error": {"message": ...}}), else the body's start."""
    text = raw.decode("utf-8", "replace")
    try:
        error = json.loads(text).get("error")
        text = error.get("message", text) if isinstance(error, dict) else str(error or text)
    except (ValueError, AttributeError):
        pass
    return " ".join(text.split())[:300] or "no message"


def _retry_after(value: str | None) -> float | None:
    """Retry-After as seconds: a number of seconds or an HTTP date (RFC 9110 10.2.3); None when absent or unread."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time()) if when.tzinfo else None
