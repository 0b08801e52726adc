"""The job page's evaluation, samples and Chat panel in a real browser, over a real server and inference worker."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page

from tunestudio.jobs.manager import JobManager
from tunestudio.jobs.models import Job
from tunestudio.settings import Settings

from ..helpers.browser import browser, open_page, playwright, screenshot  # noqa: F401  (module fixtures)
from ..helpers.chat import PROMPT, ChatHome, ScriptedPool
from ..helpers.jobs import DATA
from ..helpers.server import running_server
from ..helpers.vision import PICTURE, QUESTION, copies_its_model, record_jobs

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]


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
def page(browser: Browser) -> Iterator[Page]:  # noqa: F811
    with open_page(browser, timeout_ms=60_000) as page:
        yield page


def send(page: Page, prompt: str) -> None:
    page.locator("#chat-input").fill(prompt)
    page.locator("#chat-input").press("Enter")
    page.locator("#chat-send:not([disabled])").wait_for()  # every side has answered


def replies(page: Page, model: str) -> list[str]:
    return page.locator(f'.chat-log[data-model="{model}"] .chat-msg.assistant .chat-text').all_inner_texts()


def test_evaluation_samples_and_chat_with_compare(server: str, job: Job, page: Page) -> None:
    page.goto(f"{server}/#/jobs/{job.id}")
    table = page.locator("#evaluation")
    table.wait_for()
    for metric in ("exact_match", "token_f1", "rouge_l", "eval_loss", "perplexity"):
        assert table.locator(f'tr[data-metric="{metric}"]').count() == 1
    sample = job.result["samples"][0]
    assert sample["after"] in page.locator("#samples").inner_text()

    page.locator("#chat-temperature").fill("0")
    page.locator("#chat-max-tokens").fill("40")
    send(page, PROMPT)
    assert [r.strip() for r in replies(page, job.id)] == [sample["after"]]

    page.locator("#chat-compare").check()  # a comparison starts a fresh conversation on both sides
    assert page.locator(".chat-columns.two .chat-side").count() == 2
    send(page, PROMPT)
    assert [r.strip() for r in replies(page, f"{job.id}:base")] == [sample["before"]]
    assert [r.strip() for r in replies(page, job.id)] == [sample["after"]]
    screenshot(page, "job-chat-compare.png")

    # A turn refused for a bad setting is taken back on both sides (issue 38, finding 17): no "you" left without
    # an answer, the error shown, the prompt back in the box; the conversation goes on without it.
    page.locator("#chat-temperature").fill("-3")
    send(page, "a refused turn")
    assert "temperature" in page.locator("#chat-error:not([hidden])").inner_text()
    assert page.locator("#chat-input").input_value() == "a refused turn"
    page.locator("#chat-temperature").fill("0")
    send(page, PROMPT)
    for model in (f"{job.id}:base", job.id):
        assert page.locator(f'.chat-log[data-model="{model}"] .chat-msg.user').count() == 2
        assert len(replies(page, model)) == 2
    assert page.locator("#chat-error").is_hidden()

    page.locator("#chat-clear").click()
    assert replies(page, job.id) == []


def test_tools_calls_results_and_reasoning_have_their_own_bubbles(job: Job, home: Path, page: Page,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 41: a model that thinks and calls (a scripted pool: the tiny job was not taught calls). Its reasoning
    is folded, its call is a bubble of its own, and the next message goes back as the call's result."""
    pool = ScriptedPool(['<think>Weather: ask.</think>\n<tool_call>\n{"name": "get_weather", "arguments": '
                         '{"city": "Paris"}}\n</tool_call>', "It is sunny in Paris."])
    monkeypatch.setattr("tunestudio.api.InferencePool", lambda *args, **kwargs: pool)
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}
    with running_server(Settings(home=home)) as url:
        page.goto(f"{url}/#/jobs/{job.id}")
        page.locator("#chat-tools").fill("[not json")
        page.locator("#chat-input").fill("What is the weather in Paris?")
        page.locator("#chat-input").press("Enter")
        assert "tools: not JSON" in page.locator("#chat-error:not([hidden])").inner_text()
        page.locator("#chat-tools").fill(json.dumps([weather]))
        send(page, "What is the weather in Paris?")
        log = page.locator(f'.chat-log[data-model="{job.id}"]')
        assert log.locator(".chat-msg.call .chat-text").all_inner_texts() == ['get_weather({"city": "Paris"})']
        fold = log.locator("details.chat-reasoning")
        assert fold.locator("summary").inner_text() == "reasoning" and fold.get_attribute("open") is None
        assert fold.locator("pre").text_content() == "Weather: ask."
        send(page, "sunny, 21 C")  # the call's result
        assert log.locator(".chat-msg.tool .chat-text").all_inner_texts() == ["sunny, 21 C"]
        assert replies(page, job.id)[-1] == "It is sunny in Paris."
        screenshot(page, "job-chat-tools.png")
    messages, tools = pool.requests[-1]
    assert tools is not None and tools.names == ["get_weather"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["content"] == "" and messages[1]["reasoning_content"] == "Weather: ask."
    assert messages[2]["tool_call_id"] == messages[1]["tool_calls"][0]["id"] and messages[2]["name"] == "get_weather"


@pytest.fixture(scope="module")
def image_server(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """Image jobs of both tiny families and a text job, recorded without training (tests/helpers/vision.py)."""
    folder = tmp_path_factory.mktemp("web-images")
    settings = Settings(home=folder / "home", dataset_roots=[DATA])
    with JobManager(settings, worker_target=copies_its_model) as manager:
        manager.start()
        jobs = record_jobs(manager, folder, tiny_model)
        with running_server(settings, manager) as url:
            yield url, jobs


def test_an_image_job_s_chat_attaches_a_picture_and_shows_it(image_server: tuple[str, dict[str, str]],
                                                             page: Page) -> None:
    url, jobs = image_server
    page.goto(f"{url}/#/jobs/{jobs['text']}")
    page.locator("#chat-input").wait_for()
    page.locator("#chat-template:not(:text('reading…'))").wait_for(state="attached")  # settings read: a text model
    assert page.locator("#chat-attach").is_hidden()

    job = jobs["qwen2_vl"]
    page.goto(f"{url}/#/jobs/{job}")
    page.locator("#chat-attach").wait_for()  # shown once the settings say the model reads images
    page.locator("#chat-image").set_input_files(str(PICTURE))
    page.locator("#chat-attached img.chat-thumb").wait_for()
    page.locator("#chat-max-tokens").fill("4")
    send(page, QUESTION)
    said = page.locator(f'.chat-log[data-model="{job}"] .chat-msg.user')
    assert said.locator("img.chat-image").get_attribute("src").startswith("data:image/png;base64,")
    assert said.locator(".chat-text").inner_text() == QUESTION
    assert len(replies(page, job)) == 1 and page.locator("#chat-error").is_hidden()
    assert page.locator("#chat-attached").is_hidden()  # sent: the next message goes without it
    page.locator("#chat-template-card summary").click()
    page.locator("#chat-prompt:has-text('<|image_pad|>')").wait_for()  # the prompt the model read holds its tokens
    screenshot(page, "job-chat-image.png")
