"""Settings as a job file and the chat settings, in a real browser over a real server, trained job and inference
worker: copy a job's settings as a job file and a CLI command, paste the file into the form and copy the form's
again (the same config), the clipboard's fallback, and the chat panel's weights, system prompt, template and the
prompt the model saw. Every view passes axe and does not scroll sideways at 390 px."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page

from tunestudio.config.files import parse_config_text
from tunestudio.jobs.models import Job
from tunestudio.settings import Settings

from ..helpers.browser import browser, narrowed, open_page, playwright, screenshot  # noqa: F401  (module fixtures)
from ..helpers.chat import PROMPT, ChatHome, add_saved_step
from ..helpers.jobs import DATA
from ..helpers.server import running_server
from .test_web_studio import axe_serious

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]
SECRET = "hf_NeverInCopiedText42"
SYSTEM = "You answer like a farmer."


@pytest.fixture(scope="module")
def job(chat_home: ChatHome) -> Job:
    add_saved_step(chat_home.job, 20)
    return chat_home.job


@pytest.fixture(scope="module")
def server(job: Job, chat_home: ChatHome, tiny_model: Path) -> Iterator[str]:
    settings = Settings(home=chat_home.home, dataset_roots=[DATA], model_roots=[tiny_model.parent])
    with running_server(settings) as url:
        yield url


@pytest.fixture
def page(browser: Browser, server: str) -> Iterator[Page]:  # noqa: F811
    with open_page(browser, timeout_ms=60_000) as page:
        page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server)
        yield page


def config_of(text: str) -> dict:
    return parse_config_text(text)[0].public_dict()


def test_a_jobs_file_copied_pasted_into_the_form_and_copied_again_is_the_same_job(server: str, job: Job,
                                                                                 page: Page) -> None:
    expected = httpx.get(f"{server}/api/jobs/{job.id}/jobfile", timeout=30).json()
    page.goto(f"{server}/#/jobs/{job.id}")
    page.locator("#config-card summary").click()
    page.locator("#copy-jobfile").click()
    page.locator("#copy-said", has_text="Copied the job file").wait_for()
    assert page.evaluate("() => navigator.clipboard.readText()") == expected["yaml"]
    assert page.locator("#copy-text").input_value() == expected["yaml"]
    page.locator("#copy-command").click()
    page.locator("#copy-said", has_text="Copied the CLI command").wait_for()
    assert page.locator("#copy-text").input_value() == expected["command"]
    assert axe_serious(page) == []

    page.goto(f"{server}/#/new")
    page.locator("#paste-jobfile").click()
    page.locator("#jobfile-text").fill("learning_rate: lots\nbatch_sise: 2\n")
    page.locator("#jobfile-fill").click()
    page.locator('#jobfile-errors li[data-field="learning_rate"]').wait_for()
    assert page.locator('#jobfile-errors li[data-field="batch_sise"]').count() == 1
    assert page.locator("#jobfile-dialog").evaluate("(d) => d.open")
    assert axe_serious(page) == []
    screenshot(page, "form-paste-jobfile-errors.png")

    page.locator("#jobfile-text").fill(expected["yaml"].replace("max_steps: 40", "max_steps: 41")
                                       + f"hf_token: {SECRET}\nname: the cow's job\n")
    page.locator("#jobfile-fill").click()
    page.locator("#jobfile-filled", has_text="hf_token is not filled in").wait_for()
    assert not page.locator("#jobfile-dialog").evaluate("(d) => d.open")
    assert page.locator("#f-max_steps").input_value() == "41"
    assert page.locator("#f-job-name").input_value() == "the cow's job"  # the file's name is the job's
    page.locator("#f-eval_steps").fill("10")  # a whole number typed: written whole (issue 38, finding 16)
    # the chat job's sample prompt has two lines: the form holds one prompt a line, and says so
    assert "sample_prompts: the form keeps one item a line" in page.locator("#jobfile-filled").inner_text()

    page.locator("#advanced").evaluate("(d) => { d.open = true; }")
    page.locator("#f-hf_token").fill(SECRET)  # typed in by hand: still never in what is copied
    page.locator("#form-copy-jobfile").click()
    page.locator("#copy-said", has_text="Copied the job file").wait_for()
    copied = page.locator("#copy-text").input_value()
    assert SECRET not in copied and "hf_token" not in copied
    assert "eval_steps: 10\n" in copied and parse_config_text(copied)[1] == "the cow's job"
    assert config_of(copied) == {**config_of(expected["yaml"]), "max_steps": 41,  # the same job, as the form holds it
                                 "sample_prompts": PROMPT.split("\n\n"), "eval_steps": 10}
    page.locator("#form-copy-command").click()
    page.locator("#copy-said", has_text="Copied the CLI command").wait_for()
    command = page.locator("#copy-text").input_value()
    assert command.rstrip().endswith("tunestudio train job.yaml") and SECRET not in command


def test_without_a_clipboard_the_text_is_selected_for_copying(server: str, job: Job, page: Page) -> None:
    page.add_init_script("Object.defineProperty(Navigator.prototype, 'clipboard', {get: () => undefined})")
    page.goto(f"{server}/#/new")
    page.locator("#f-learning_rate").fill("0,5")  # an error at its field, nothing copied
    page.locator("#form-copy-jobfile").click()
    page.locator('.field.invalid[data-field="learning_rate"]').wait_for()
    assert page.locator("#form-jobfile-out").is_hidden()
    page.locator("#f-learning_rate").fill("0.002")
    page.locator("#form-copy-command").click()
    page.locator("#copy-said", has_text="Ctrl+C").wait_for()
    selected = page.evaluate("""() => { const box = document.activeElement;
      return box.id === 'copy-text' && box.selectionStart === 0 && box.selectionEnd === box.value.length; }""")
    assert selected
    assert "learning_rate: 0.002" in page.locator("#copy-text").input_value()
    assert narrowed(page) <= 390
    screenshot(page, "form-copy-fallback-390.png")


def test_chat_with_a_system_prompt_and_a_saved_step_shows_the_template_and_the_prompt(server: str, job: Job,
                                                                                      page: Page) -> None:
    template = (Path(job.output_dir or "") / "chat_template.jinja").read_text()
    page.goto(f"{server}/#/jobs/{job.id}")
    weights = page.locator("#chat-weights")
    page.locator(f'#chat-weights option[value="{job.id}:step-20"]').wait_for(state="attached")
    assert weights.locator("option").all_inner_texts() == ["final weights", "step 20"]
    page.locator("#chat-template-card summary").click()
    assert page.locator("#chat-template").inner_text() == template

    page.locator("#chat-system").fill(SYSTEM)
    page.locator("#chat-temperature").fill("0")
    page.locator("#chat-max-tokens").fill("12")
    page.locator("#chat-input").fill(PROMPT)
    page.locator("#chat-input").press("Enter")
    page.locator("#chat-send:not([disabled])").wait_for()
    page.locator("#chat-prompt", has_text="<|system|>").wait_for()
    assert page.locator("#chat-prompt").inner_text().endswith(
        f"<|system|>{SYSTEM}<|end|><|user|>{PROMPT}<|end|><|assistant|>")
    assert f"for {job.id}" in page.locator("#chat-prompt-note").inner_text()
    assert axe_serious(page) == []

    weights.select_option(f"{job.id}:step-20")  # other weights: a fresh conversation with them
    assert page.locator(f'.chat-log[data-model="{job.id}:step-20"] .chat-msg').count() == 0
    page.locator("#chat-input").fill(PROMPT)
    page.locator("#chat-input").press("Enter")
    page.locator("#chat-send:not([disabled])").wait_for()
    assert page.locator(f'.chat-log[data-model="{job.id}:step-20"] .chat-msg.assistant').count() == 1
    assert page.locator("#chat-error").is_hidden()
    page.locator("#chat-prompt-note", has_text=f"for {job.id}:step-20").wait_for()
    assert narrowed(page) <= 390
    screenshot(page, "job-chat-settings-390.png")
