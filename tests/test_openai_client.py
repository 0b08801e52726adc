"""The shared OpenAI-compatible client against a scripted loopback endpoint (the model name picks the script): a
trickling reply is cut at the call's deadline, an oversized one is refused without being read whole, 429 (with its
Retry-After) and 500 are retried, a refused key is named, and a cancel ends a call under way."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from tests.helpers.ports import refused_port
from tests.helpers.scripted_v1 import HUGE, SEEN, SENT, Scripted
from tests.helpers.server import loopback_v1
from tests.helpers.wait import wait_until
from tunestudio.openai_client import (
    Cancelled,
    DeadlineExceeded,
    HttpStatusError,
    KeyRefused,
    OpenAIClient,
    ReplyTooLarge,
    Unreachable,
)

KEY = "sk-secret-4711"


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with loopback_v1(Scripted) as base:
        yield base


MESSAGES = [{"role": "user", "content": "which?"}]


def client(url: str, **settings: object) -> OpenAIClient:
    return OpenAIClient(url, **{"key": KEY, "backoff_s": 0.01, "name": "the judge", **settings})  # type: ignore[arg-type]


def test_a_reply_comes_back_with_the_key_sent(url: str) -> None:
    assert client(url).chat("ok", MESSAGES, temperature=0) == "fine"
    assert KEY not in repr(client(url))


def test_a_trickling_reply_is_cut_at_the_calls_deadline(url: str) -> None:
    # a byte every 0.2 s keeps every read inside any read timeout: only a deadline for the whole call ends it
    with pytest.raises(DeadlineExceeded, match="did not answer within its deadline of 1 s"):
        client(url, deadline_s=1).chat("trickle", MESSAGES)


def test_an_oversized_reply_is_refused_without_being_read_whole(url: str) -> None:
    with pytest.raises(ReplyTooLarge, match="over the cap of 262,144 bytes; it was cut"):
        client(url, max_reply_bytes=256 * 1024).chat("huge", MESSAGES)
    with pytest.raises(ReplyTooLarge, match="67,108,864 bytes, over the cap of 262,144 bytes; it was not read"):
        client(url, max_reply_bytes=256 * 1024).chat("huge-declared", MESSAGES)
    wait_until(lambda: len(SENT) == 2, 30, "both scripts to see the client hang up")
    assert all(sent < HUGE // 2 for sent in SENT.values()), SENT  # the client hung up, it did not drain the reply


def test_a_429_is_retried_after_its_retry_after(url: str) -> None:
    assert client(url).chat("429-then-ok", MESSAGES) == "fine"
    first, second = SEEN["429-then-ok"]
    assert second - first >= 1.0  # Retry-After: 1 was honoured, not the 0.01 s backoff


def test_a_500_is_retried(url: str) -> None:
    assert client(url).chat("500-then-ok", MESSAGES) == "fine"
    assert len(SEEN["500-then-ok"]) == 2


def test_5xx_retries_stop_at_their_count_with_the_last_answer(url: str) -> None:
    with pytest.raises(HttpStatusError, match="HTTP 503: overloaded \\(3 tries\\)") as caught:
        client(url, retries=2).chat("always-503", MESSAGES)
    assert caught.value.status == 503 and len(SEEN["always-503"]) == 3


def test_a_refused_key_is_named_and_never_shown(url: str) -> None:
    with pytest.raises(KeyRefused, match="HTTP 401: the key was refused") as caught:
        client(url).chat("401", MESSAGES)
    assert KEY not in str(caught.value) and "***" in str(caught.value)  # the endpoint's echo of it is masked
    with pytest.raises(KeyRefused, match="HTTP 403: the key was refused"):
        client(url).chat("403", MESSAGES)
    with pytest.raises(KeyRefused, match="it wants a key and none was given"):
        client(url, key=None).chat("401", MESSAGES)
    assert len(SEEN["401"]) == 2  # a refused key is not retried


def test_another_refusal_is_not_retried(url: str) -> None:
    with pytest.raises(HttpStatusError, match="HTTP 400: no such model"):
        client(url).chat("400", MESSAGES)
    assert len(SEEN["400"]) == 1


def test_a_cancel_ends_a_call_under_way(url: str) -> None:
    cancel, caught = threading.Event(), []

    def call() -> None:
        try:
            client(url, deadline_s=60).chat("trickle", MESSAGES, cancel=cancel)
        except Cancelled as exc:
            caught.append(exc)

    before = len(SEEN["trickle"])
    thread = threading.Thread(target=call)
    thread.start()
    wait_until(lambda: len(SEEN["trickle"]) > before, 10, "the call to reach the endpoint")
    cancel.set()
    thread.join(10)
    assert not thread.is_alive() and caught and "was cancelled" in str(caught[0])


def test_an_unreachable_endpoint_is_named_after_its_retries() -> None:
    with refused_port() as port, pytest.raises(Unreachable, match=r"unreachable .* \(2 tries\)"):
        OpenAIClient(f"http://127.0.0.1:{port}/v1", retries=1, backoff_s=0.01).chat("m", MESSAGES)
