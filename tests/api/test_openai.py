"""/v1 through OpenAI's own Python client, against a real server, a real trained job and a real inference worker."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tunestudio.jobs.models import Job
from tunestudio.settings import Settings

from ..helpers.chat import PROMPT, train_chat_job
from ..helpers.jobs import DATA
from ..helpers.server import running_server
from ..helpers.wait import wait_until

MESSAGES = [{"role": "user", "content": PROMPT}]
# The first test waits for the module's training job (minutes on a busy 2-core machine): a generous hard timeout.
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("openai") / "home"


@pytest.fixture(scope="module")
def job(tiny_model: Path, home: Path) -> Job:
    return train_chat_job(tiny_model, home)


@pytest.fixture(scope="module")
def server(job: Job, home: Path) -> Iterator[str]:
    with running_server(Settings(home=home, dataset_roots=[DATA])) as url:
        yield url


@pytest.fixture
def client(server: str) -> Iterator[openai.OpenAI]:
    # max_retries=0: a retried 503 would hide the error a test wants to see.
    with openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=120) as client:
        yield client


def status(server: str) -> dict:
    return httpx.get(f"{server}/api/inference", timeout=10).json()


def test_models_lists_the_job_and_its_base(client: openai.OpenAI, job: Job) -> None:
    ids = [m.id for m in client.models.list()]
    assert ids == [job.id, f"{job.id}:base"]
    assert client.models.retrieve(f"{job.id}:base").id == f"{job.id}:base"


def test_chat_whole_and_streamed_agree_and_count_tokens(client: openai.OpenAI, job: Job) -> None:
    whole = client.chat.completions.create(model=job.id, messages=MESSAGES, temperature=0, max_tokens=40)
    answer = whole.choices[0].message.content
    assert whole.object == "chat.completion" and whole.model == job.id
    assert answer and whole.choices[0].finish_reason in ("stop", "length")
    usage = whole.usage
    assert usage.prompt_tokens > 5 and 0 < usage.completion_tokens <= 40
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens

    chunks = list(client.chat.completions.create(model=job.id, messages=MESSAGES, temperature=0, max_tokens=40,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == answer
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == usage.completion_tokens


def test_base_and_fine_tuned_answer_differently_as_the_worker_saw_them(client: openai.OpenAI, job: Job) -> None:
    def ask(model: str) -> str:
        answer = client.chat.completions.create(model=model, messages=MESSAGES, temperature=0, max_tokens=40)
        return answer.choices[0].message.content.strip()

    tuned, base = ask(job.id), ask(f"{job.id}:base")
    assert tuned != base
    # The training worker generated the same prompt greedily before and after training: one base model with
    # its adapter switched off and on answers exactly as the two models did there.
    sample = job.result["samples"][0]
    assert (base, tuned) == (sample["before"], sample["after"])
    assert ask(job.id) == tuned  # switching back and forth leaves the adapter as it was


def test_unknown_model_is_a_404_in_openai_shape(client: openai.OpenAI, server: str, job: Job) -> None:
    for model in ("no-such-job", "no-such-job:base"):
        with pytest.raises(openai.NotFoundError) as caught:
            client.chat.completions.create(model=model, messages=MESSAGES)
        assert caught.value.code == "model_not_found" and "does not exist" in caught.value.message
    raw = httpx.post(f"{server}/v1/chat/completions", json={"model": "nope", "messages": MESSAGES}, timeout=10)
    assert raw.status_code == 404
    assert set(raw.json()["error"]) == {"message", "type", "param", "code"}


def test_bad_requests_are_400_naming_the_field(client: openai.OpenAI, job: Job) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=job.id, messages=MESSAGES, temperature=5)
    assert "temperature" in caught.value.message
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=job.id, messages=[])


def test_stop_sequences_cut_the_answer(client: openai.OpenAI, job: Job) -> None:
    full = client.chat.completions.create(model=job.id, messages=MESSAGES, temperature=0, max_tokens=40)
    text = full.choices[0].message.content
    answer = text.strip()
    assert len(answer) >= 2
    cut_at = answer[len(answer) // 2 :]  # the answer's second half: the stop string comes after some text
    for stream in (False, True):
        answer = client.chat.completions.create(model=job.id, messages=MESSAGES, temperature=0, max_tokens=40,
                                                stop=[cut_at], stream=stream)
        got = ("".join(c.choices[0].delta.content or "" for c in answer if c.choices) if stream
               else answer.choices[0].message.content)
        assert got == text[: text.index(cut_at)]


def test_a_client_that_disconnects_mid_stream_frees_the_worker(server: str, job: Job) -> None:
    body = {"model": job.id, "messages": MESSAGES, "stream": True, "max_tokens": 400, "min_tokens": 400}
    cancelled = status(server)["cancelled"]
    with httpx.stream("POST", f"{server}/v1/chat/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))  # the stream is running
    # The worker stops generating (a cancel, not 400 tokens later) and is free for the next request.
    wait_until(lambda: (s := status(server))["in_flight"] == 0 and s["cancelled"] == cancelled + 1, 30)
    answer = httpx.post(f"{server}/v1/chat/completions", timeout=60,
                        json={"model": job.id, "messages": MESSAGES, "temperature": 0, "max_tokens": 5})
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] > 0


def test_a_crashed_worker_fails_the_request_in_flight_and_restarts(client: openai.OpenAI, server: str,
                                                                   job: Job) -> None:
    client.chat.completions.create(model=job.id, messages=MESSAGES, max_tokens=1)  # the worker is up
    before = status(server)
    stream = client.chat.completions.create(model=job.id, messages=MESSAGES, stream=True, max_tokens=400,
                                            extra_body={"min_tokens": 400})
    with pytest.raises(openai.APIError) as caught:
        for n, _ in enumerate(stream):
            if n == 1:
                os.kill(before["pid"], signal.SIGKILL)  # the worker dies in the middle of the answer
    assert "inference worker killed by signal 9" in caught.value.message
    assert "the next request starts a new one" in caught.value.message
    answer = client.chat.completions.create(model=job.id, messages=MESSAGES, temperature=0, max_tokens=40)
    assert answer.choices[0].message.content.strip() == job.result["samples"][0]["after"]
    after = status(server)
    assert after["pid"] != before["pid"] and after["crashes"] == before["crashes"] + 1


def test_the_token_rules_of_the_api_apply(job: Job, home: Path) -> None:
    settings = Settings(home=home, api_token="s3cret")
    with running_server(settings) as url:
        with openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0) as wrong, \
                pytest.raises(openai.AuthenticationError):
            wrong.models.list()
        with openai.OpenAI(base_url=f"{url}/v1", api_key="s3cret", max_retries=0) as right:
            assert job.id in [m.id for m in right.models.list()]
        assert httpx.get(f"{url}/api/inference", timeout=10).status_code == 401
