"""/v1/chat/completions with images, through OpenAI's own client, against a real server and a real inference worker:
finished image jobs of both tiny vision families (and a text job) recorded cheaply, by a worker that copies its
base model into its output folder instead of training (the chat worker serves that folder as the job's model)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tunestudio.jobs.manager import JobManager
from tunestudio.settings import Settings

from ..helpers.jobs import DATA
from ..helpers.server import running_server
from ..helpers.vision import FAMILIES, PICTURE, QUESTION, REPO, asking, copies_its_model, data_url, record_jobs

pytestmark = pytest.mark.timeout(300)


@dataclass(frozen=True)
class Served:
    url: str
    jobs: dict[str, str]  # family (or "text") → job id


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[Served]:
    home = tmp_path_factory.mktemp("images")
    settings = Settings(home=home / "home", dataset_roots=[DATA], model_roots=[REPO / "models", tiny_model])
    manager = JobManager(settings, worker_target=copies_its_model)
    manager.start()
    jobs = record_jobs(manager, home, tiny_model)
    with running_server(settings, manager) as url:
        yield Served(url, jobs)
    manager.close()


@pytest.fixture
def client(served: Served) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0, timeout=120) as client:
        yield client


def create(client: openai.OpenAI, model: str, messages: list[dict[str, Any]], **fields: Any) -> Any:
    # min_tokens: the tiny models' random weights may end an answer at once
    return client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=6,
                                          extra_body={"min_tokens": 6}, **fields)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_an_image_model_answers_a_picture_whole_and_streamed(client: openai.OpenAI, served: Served,
                                                             family: str) -> None:
    model = served.jobs[family]
    messages = asking(data_url(PICTURE.read_bytes()))
    whole = create(client, model, messages)
    answer = whole.choices[0].message.content
    assert answer and whole.usage.completion_tokens == 6
    chunks = list(create(client, model, messages, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == answer
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    # The picture's tokens are in the prompt: the words alone make fewer.
    words = create(client, model, [{"role": "user", "content": QUESTION}])
    assert words.usage.prompt_tokens < whole.usage.prompt_tokens
    # A file inside the server's folders is the same picture as its bytes.
    for url in (f"file://{PICTURE}", str(PICTURE)):
        assert create(client, model, asking(url)).choices[0].message.content == answer


def test_a_picture_larger_than_other_request_bodies_may_be_is_taken(client: openai.OpenAI, served: Served) -> None:
    import io
    import random

    from PIL import Image

    noise = Image.frombytes("RGB", (700, 700), random.Random(0).randbytes(700 * 700 * 3))
    buffer = io.BytesIO()
    noise.save(buffer, "PNG")
    assert len(buffer.getvalue()) > Settings().max_body_bytes  # the chat routes take up to max_chat_body_bytes
    assert create(client, served.jobs["smolvlm"], asking(data_url(buffer.getvalue()))).usage.completion_tokens == 6


def refusal(client: openai.OpenAI, model: str, messages: list[dict[str, Any]], stream: bool = False) -> Any:
    with pytest.raises(openai.BadRequestError) as caught:
        create(client, model, messages, stream=stream)
    return caught.value


@pytest.mark.parametrize(("url", "code", "said"), [
    ("https://example.com/cat.png", "image_url_not_fetched", "the server fetches nothing"),
    ("data:image/png;base64,not*base64!", "invalid_image", "base64 is not valid"),
    ("data:image/png,rawbytes", "invalid_image", "must be base64-encoded"),
    ("data:text/plain;base64,aGk=", "invalid_image", "not an image"),
    (data_url(b"this is no picture"), "invalid_image", "cannot be read"),  # Pillow's verdict, in the worker
    (data_url(PICTURE.read_bytes()[:100]), "invalid_image", "cannot be read"),  # a truncated PNG
    ("/etc/hostname", "path_not_allowed", "outside the model and data folders"),
    ("cat.png", "invalid_image", "a data: URL"),
])
def test_an_image_the_server_cannot_take_is_a_400_naming_its_part(client: openai.OpenAI, served: Served, url: str,
                                                                 code: str, said: str) -> None:
    messages = [{"role": "system", "content": "Be brief."}, *asking(url)]
    for stream in (False, True):  # refused before any chunk: a plain 400 either way
        error = refusal(client, served.jobs["qwen2_vl"], messages, stream)
        assert error.code == code and said in error.message and error.param == "messages[1].content[0]", error


def test_a_file_outside_the_roots_is_refused_without_being_read(client: openai.OpenAI, served: Served,
                                                              tmp_path: Path) -> None:
    outside = tmp_path / "picture.png"
    shutil.copy(PICTURE, outside)
    for url in (str(outside), f"file://{outside}", str(tmp_path / "missing.png")):  # the same answer: no probing
        error = refusal(client, served.jobs["smolvlm"], asking(url))
        assert error.code == "path_not_allowed" and "outside" in error.message


def test_a_text_model_and_a_non_user_turn_refuse_images(client: openai.OpenAI, served: Served) -> None:
    picture = data_url(PICTURE.read_bytes())
    error = refusal(client, served.jobs["text"], asking(picture))
    assert error.code == "image_not_supported" and "reads no images" in error.message
    assert error.param == "messages[0].content[0]"
    turn = {"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": picture}}]}
    error = refusal(client, served.jobs["smolvlm"], [*asking(picture), turn, {"role": "user", "content": "and?"}])
    assert "only a user turn may hold images" in error.message


def test_the_page_learns_which_models_read_images_and_sees_their_prompt(served: Served) -> None:
    with httpx.Client(base_url=served.url, timeout=120) as http:
        assert http.get(f"/api/jobs/{served.jobs['smolvlm']}/chat").json()["images"] is True
        assert http.get(f"/api/jobs/{served.jobs['text']}/chat").json()["images"] is False
        shown = http.post("/api/chat/prompt", json={"model": served.jobs["smolvlm"],
                                                    "messages": asking(data_url(PICTURE.read_bytes()))})
        assert shown.status_code == 200, shown.text
        assert shown.json()["prompt"].count("<image>") == 4 and QUESTION in shown.json()["prompt"]
