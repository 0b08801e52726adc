"""The judge endpoint over real HTTP (a loopback server): answers, refusals, time-outs and no server at all."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import pytest

from tests.helpers.ports import refused_port
from tests.helpers.server import loopback_v1
from tunestudio.judge import Endpoint, JudgeError, JudgeNotConfigured

SEEN: list[dict] = []


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        SEEN.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
        model = body["model"]
        if model == "slow":
            time.sleep(2)
        if model == "refuses":
            self._send(500, {"error": {"message": "the judge model is loading", "type": "server_error"}})
        elif model == "not-chat":
            self._send(200, {"hello": "world"})
        else:
            self._send(200, {"choices": [{"message": {"role": "assistant", "content": '{"verdict": "2"}'}}]})

    def _send(self, status: int, data: dict) -> None:
        raw = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with loopback_v1(Handler) as base:
        yield base


MESSAGES = [{"role": "user", "content": "which?"}]


def test_a_judge_answers_greedily_with_the_key_from_the_environment(url: str) -> None:
    endpoint = Endpoint.from_env(environ={"TUNESTUDIO_JUDGE_URL": url + "/", "TUNESTUDIO_JUDGE_MODEL": "j",
                                          "OPENAI_API_KEY": "sk-test"})
    assert endpoint(MESSAGES) == '{"verdict": "2"}'
    seen = SEEN[-1]
    assert seen["path"] == "/v1/chat/completions" and seen["auth"] == "Bearer sk-test"
    assert seen["body"]["temperature"] == 0 and seen["body"]["messages"] == MESSAGES
    assert "sk-test" not in json.dumps(endpoint.describe())


@pytest.mark.parametrize(("model", "words"), [
    ("refuses", "HTTP 500: the judge model is loading"),
    ("not-chat", "not an OpenAI chat completion"),
])
def test_a_judge_that_does_not_answer_says_why(url: str, model: str, words: str) -> None:
    with pytest.raises(JudgeError, match=words):
        Endpoint(url, model, retries=0)(MESSAGES)


def test_a_slow_judge_times_out(url: str) -> None:
    with pytest.raises(JudgeError, match=r"did not answer within its deadline of 0\.5 s"):
        Endpoint(url, "slow", deadline_s=0.5)(MESSAGES)


def test_the_deadline_comes_from_the_environment() -> None:
    env = {"TUNESTUDIO_JUDGE_URL": "http://127.0.0.1:1/v1", "TUNESTUDIO_JUDGE_MODEL": "m"}
    assert Endpoint.from_env(environ=env).deadline_s == 120
    assert Endpoint.from_env(environ={**env, "TUNESTUDIO_JUDGE_DEADLINE_S": "2.5"}).deadline_s == 2.5
    assert Endpoint.from_env(environ=env, deadline_s=7).deadline_s == 7
    for bad in ("0", "-1", "nan", "soon", "3601"):
        with pytest.raises(JudgeNotConfigured, match="TUNESTUDIO_JUDGE_DEADLINE_S"):
            Endpoint.from_env(environ={**env, "TUNESTUDIO_JUDGE_DEADLINE_S": bad})


def test_an_unreachable_judge_is_named() -> None:
    with refused_port() as port, pytest.raises(JudgeError, match="unreachable"):
        Endpoint(f"http://127.0.0.1:{port}/v1", "j", deadline_s=5, retries=1, backoff_s=0.01)(MESSAGES)


@pytest.mark.parametrize(("env", "words"), [
    ({}, "TUNESTUDIO_JUDGE_URL and TUNESTUDIO_JUDGE_MODEL"),
    ({"TUNESTUDIO_JUDGE_URL": "http://127.0.0.1:1/v1"}, "set TUNESTUDIO_JUDGE_MODEL"),
    ({"TUNESTUDIO_JUDGE_URL": "ftp://x", "TUNESTUDIO_JUDGE_MODEL": "m"}, "not an http"),
])
def test_no_judge_configured_names_the_variables(env: dict[str, str], words: str) -> None:
    with pytest.raises(JudgeNotConfigured, match=words):
        Endpoint.from_env(environ=env)
