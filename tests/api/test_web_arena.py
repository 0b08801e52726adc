"""The arena in a real browser over a real server and inference worker: the chat job against its base, blind,
voted with the keyboard; the vote stored, undone, voted again, and the leaderboard shown."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from tunestudio.jobs.models import Job
from tunestudio.settings import Settings

from ..helpers.browser import browser, open_page, playwright, screenshot  # noqa: F401  (module fixtures)
from ..helpers.chat import PROMPT, ChatHome
from ..helpers.jobs import DATA
from ..helpers.server import running_server
from ..helpers.wait import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def served(chat_home: ChatHome) -> Iterator[tuple[str, Job]]:
    with running_server(Settings(home=chat_home.home, dataset_roots=[DATA])) as url:
        yield url, chat_home.job


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:  # noqa: F811
    with open_page(browser, timeout_ms=60_000) as page:
        yield page


def test_a_blind_vote_by_keyboard_is_stored_undone_and_counted(served: tuple[str, Job], page: Page) -> None:
    url, job = served
    base = f"{job.id}:base"
    page.goto(f"{url}/#/arena")
    for model in (job.id, base):
        page.locator(f'input.arena-pick[value="{model}"]').check()
    page.locator("#arena-save-models").click()
    expect(page.locator("#arena-models-note")).to_have_text("2 models in the arena")

    page.locator("#arena-temperature").fill("0")
    page.locator("#arena-max-tokens").fill("24")
    page.locator("#arena-prompt").fill(PROMPT)
    page.locator("#arena-prompt").press("Control+Enter")
    expect(page.locator("#arena-vote-a")).to_be_enabled(timeout=120_000)
    assert page.locator("#arena-name-a").inner_text() == "" and page.locator("#arena-name-b").inner_text() == ""
    assert job.id not in page.locator("#arena-battle").inner_text()  # blind: no name on the page before the vote

    page.locator("#arena-prompt").blur()
    page.keyboard.press("1")
    expect(page.locator("#arena-voted")).to_have_text("You voted: A is better.")
    names = {page.locator("#arena-name-a").inner_text(), page.locator("#arena-name-b").inner_text()}
    assert names == {job.id, base}
    with httpx.Client(base_url=url, timeout=30) as api:
        (stored,) = api.get("/api/arena/votes").json()["votes"]
        assert stored["vote"]["choice"] == "a" and stored["models"]["a"] in names
        assert stored["params"]["temperature"] == 0
        expect(page.locator("#arena-progress")).to_have_text("1 votes")

        page.keyboard.press("u")  # undo: the battle can be voted on again
        expect(page.locator("#arena-vote-b")).to_be_enabled()
        wait_until(lambda: api.get("/api/arena/votes").json()["total"] == 0, 10, "the undo")
        page.keyboard.press("2")
        expect(page.locator("#arena-voted")).to_have_text("You voted: B is better.")
        (stored,) = api.get("/api/arena/votes").json()["votes"]
        assert stored["vote"]["choice"] == "b"
        winner = stored["models"]["b"]
    standings = page.locator("#arena-standings tbody tr")
    expect(standings).to_have_count(2)
    expect(standings.first).to_have_attribute("data-model", winner)
    # B won the one decided vote: the left answer won 0% of 1, its 95% Wilson interval 0–79%
    expect(page.locator("#arena-position")).to_contain_text("Left answer (A) won 0% (0–79%) of 1 decided votes")
    latest = page.locator("#arena-votes tbody tr")
    expect(latest).to_have_count(1)
    expect(latest.first).to_contain_text("B is better")
    page.locator("#arena-export-dpo").click()  # one click: the votes as DPO pairs, read by the dataset report
    expect(page.locator("#arena-export-result")).to_contain_text("the report reads 1 usable rows as preference",
                                                                   timeout=60_000)
    screenshot(page, "arena.png")
