"""/v1 through OpenAI's own Python client, against a real server, a real trained job and a real inference worker."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tunestudio.inference.models import checkpoint_steps, fine_tuned_name
from tunestudio.inference_protocol import Delta, Done, Started
from tunestudio.jobs.models import Job
from tunestudio.settings import Settings
from tunestudio.worker.serve import llamacpp

from ..helpers.chat import PROMPT, ChatHome, train_chat_job
from ..helpers.jobs import DATA
from ..helpers.server import running_server
from ..helpers.wait import wait_until

MESSAGES = [{"role": "user", "content": PROMPT}]
# The first chat test of the session waits for its training job (minutes on a busy 2-core machine): a generous
# hard timeout.
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def home(chat_home: ChatHome) -> Path:
    return chat_home.home


@pytest.fixture(scope="module")
def job(chat_home: ChatHome) -> Job:
    return chat_home.job


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
    name = fine_tuned_name(job)  # and by OpenAI's fine-tuning name, and each saved checkpoint by its own
    assert ids == [job.id, f"{job.id}:base", name, *(f"{name}:ckpt-step-{n}" for n in checkpoint_steps(job))]
    assert all(client.models.retrieve(i).id == i for i in ids[3:])
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


@pytest.mark.skipif(not llamacpp.installed(), reason="llama-cpp-python is not built (`make llamacpp`)")
def test_llama_cpp_answers_through_the_api_as_pytorch_does(client: openai.OpenAI, server: str, job: Job, home: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """TUNESTUDIO_CHAT_ENGINE=llama.cpp (issue 40): the job and its base answered by llama.cpp from the worker's
    GGUF copies, whole and streamed, as the PyTorch worker of this module's server answers them."""
    def ask(api: openai.OpenAI, model: str) -> str:
        return api.chat.completions.create(model=model, messages=MESSAGES, temperature=0,
                                           max_tokens=40).choices[0].message.content

    expected = {model: ask(client, model) for model in (job.id, f"{job.id}:base")}
    monkeypatch.setenv("TUNESTUDIO_CHAT_ENGINE", "llama.cpp")
    # spawned, so that its worker reads this environment (a forkserver keeps the one it started with)
    with running_server(Settings(home=home, prewarm=False)) as url, \
            openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120) as llama:
        for model, answer in expected.items():
            assert ask(llama, model) == answer
        chunks = list(llama.chat.completions.create(model=job.id, messages=MESSAGES, temperature=0, max_tokens=40,
                                                    stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected[job.id]
        loaded = httpx.get(f"{url}/api/inference", timeout=10).json()["loaded"]
    assert any(key.endswith("(llama.cpp q8_0)") for key in loaded)
    assert any(key.endswith("(llama.cpp adapter)") for key in loaded)
    assert not any("llama.cpp" in key for key in status(server)["loaded"])  # auto, 1.2M parameters: PyTorch


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


def test_a_client_that_leaves_a_whole_answer_cancels_it_at_once(server: str, job: Job) -> None:
    warm = httpx.post(f"{server}/v1/chat/completions", timeout=60,
                      json={"model": job.id, "messages": MESSAGES, "max_tokens": 1})
    assert warm.status_code == 200  # the worker is up and holds the model: tokens follow each other closely
    cancelled = status(server)["cancelled"]
    body = json.dumps({"model": job.id, "messages": MESSAGES, "stream": False,
                       "max_tokens": 480, "min_tokens": 480}).encode()
    host, port = server.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        wait_until(lambda: status(server)["in_flight"] == 1, 30, "the request to reach the worker")
    # The client is gone while tokens keep coming: the generation is cancelled, not finished 480 tokens later.
    wait_until(lambda: (s := status(server))["in_flight"] == 0 and s["cancelled"] == cancelled + 1, 10,
               "the whole answer's generation to be cancelled")
    answer = httpx.post(f"{server}/v1/chat/completions", timeout=60,
                        json={"model": job.id, "messages": MESSAGES, "temperature": 0, "max_tokens": 5})
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] > 0


class _SteadyGeneration:
    """A generation that yields a token every 5 ms for 3 s, never pausing 0.5 s; records a cancel before its end."""

    def __init__(self, deliver: Callable[[Any], None]) -> None:
        self.deliver = deliver
        self.streaming = threading.Event()
        self.stop = threading.Event()
        self.cancelled_at: float | None = None
        self.finished = False
        self.started = None  # a Started that names no tool-call family: the answer is read as plain text

    def run(self) -> None:
        self.deliver(Started(1, 3))
        for _ in range(600):
            if self.stop.wait(0.005):
                break
            self.deliver(Delta(1, "a"))
            self.streaming.set()
        self.finished = True
        self.deliver(Done(1, "cancelled" if self.stop.is_set() else "length", 3, 600))

    def cancel(self) -> None:
        if not self.finished and not self.stop.is_set():
            self.cancelled_at = time.monotonic()
            self.stop.set()


class _SteadyPool:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.generations: list[_SteadyGeneration] = []

    def generate(self, spec: Any, messages: Any, params: Any, deliver: Callable[[Any], None],
                 tools: Any = None, images: Any = ()) -> _SteadyGeneration:
        generation = _SteadyGeneration(deliver)
        self.generations.append(generation)
        threading.Thread(target=generation.run, daemon=True).start()
        return generation

    def close(self) -> None:
        pass


def test_a_whole_answer_is_cancelled_while_tokens_keep_coming(job: Job, home: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The client's leaving is seen at once, not after 0.5 s without a token (which a steady stream never has)."""
    pool = _SteadyPool()
    monkeypatch.setattr("tunestudio.api.InferencePool", lambda *args, **kwargs: pool)
    with running_server(Settings(home=home)) as url:
        body = json.dumps({"model": job.id, "messages": MESSAGES}).encode()
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            wait_until(lambda: pool.generations and pool.generations[0].streaming.is_set(), 10, "the tokens")
        # Before the fix, the 600 tokens ran to their end (3 s) and nothing was cancelled.
        wait_until(lambda: pool.generations[0].cancelled_at, 2, "the generation's cancel")


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


def test_middleware_refusals_on_v1_are_in_openai_shape(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home", max_body_bytes=2048, max_chat_body_bytes=2048)
    with running_server(settings) as url, \
            openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30) as client:
        with pytest.raises(openai.NotFoundError) as caught:  # no such route: routing's 404
            client.get("/no-such-route", cast_to=httpx.Response)
        assert caught.value.code == "not_found" and caught.value.type == "invalid_request_error"
        with pytest.raises(openai.APIStatusError) as caught:  # BodyLimit's 413
            client.chat.completions.create(model="any", messages=[{"role": "user", "content": "x" * 4096}])
        assert caught.value.status_code == 413 and caught.value.code == "too_large"
        with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30,
                           default_headers={"Origin": "http://evil.example"}) as foreign, \
                pytest.raises(openai.PermissionDeniedError) as caught:  # RequestGuard's 403
            foreign.chat.completions.create(model="any", messages=MESSAGES)
        assert caught.value.code == "cross_origin"
        # RequestGuard's 400 for a Host this server does not answer to (the client cannot set Host: raw HTTP).
        for path in ("/v1/models", "/v1/chat/completions"):
            refused = httpx.get(f"{url}{path}", headers={"Host": "evil.example"}, timeout=10)
            assert refused.status_code == 400
            assert refused.json() == {"error": {"message": refused.json()["error"]["message"],
                                                "type": "invalid_request_error", "param": None, "code": "bad_host"}}
        # Outside /v1 the API's own shape stays.
        assert httpx.get(f"{url}/api/no-such-route", timeout=10).json()["detail"]["code"] == "not_found"
        assert httpx.get(f"{url}/api/jobs", headers={"Host": "evil.example"}, timeout=10).json()["detail"]["code"] \
            == "bad_host"


def test_an_export_is_no_chat_model(client: openai.OpenAI, server: str, job: Job, home: Path) -> None:
    # Outside the job's folder: the last test runs another job into that folder.
    created = httpx.post(f"{server}/api/jobs/{job.id}/exports", timeout=30,
                         json={"target": "merged", "output_dir": str(home / "exported")})
    assert created.status_code == 201, created.text
    export_id = created.json()["id"]
    done = wait_until(lambda: (j := httpx.get(f"{server}/api/jobs/{export_id}", timeout=10).json())["status"]
                      in ("completed", "failed", "cancelled") and j, 300, "the export's end")
    assert done["status"] == "completed", done
    name = fine_tuned_name(job)
    assert [m.id for m in client.models.list()] == [job.id, f"{job.id}:base", name,
                                                    *(f"{name}:ckpt-step-{n}" for n in checkpoint_steps(job))]
    for model in (export_id, f"{export_id}:base"):
        with pytest.raises(openai.NotFoundError) as caught:
            client.chat.completions.create(model=model, messages=MESSAGES)
        assert caught.value.code == "model_not_found"
        assert f"job {export_id} is an export; chat with its source job {job.id}" in caught.value.message


def test_a_job_whose_folder_a_later_job_wrote_over_says_so(client: openai.OpenAI, job: Job, tiny_model: Path,
                                                            home: Path) -> None:
    """Last in the module: a second job runs into the first one's folder (a job file run again)."""
    before = client.chat.completions.create(model=job.id, messages=MESSAGES, temperature=0, max_tokens=40)
    assert before.choices[0].message.content.strip() == job.result["samples"][0]["after"]  # its adapter is cached
    # The same job file run again, shorter: its weights go where the first job's were.
    second = train_chat_job(tiny_model, home, output_dir=job.output_dir, max_steps=12, eval_steps=0,
                            eval_generate_rows=0, learning_rate=1e-2, random_seed=3)
    for model in (job.id, f"{job.id}:base"):
        with pytest.raises(openai.ConflictError) as caught:
            client.chat.completions.create(model=model, messages=MESSAGES, temperature=0, max_tokens=40)
        assert caught.value.code == "model_replaced"
        assert (f"job {job.id}'s weights in {job.output_dir} were replaced by a later job ({second.id}); its model is "
                "no longer on disk") in caught.value.message
    answer = client.chat.completions.create(model=second.id, messages=MESSAGES, temperature=0, max_tokens=40)
    assert answer.choices[0].message.content.strip() == second.result["samples"][0]["after"]

