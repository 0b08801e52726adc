"""The web page's browser tests: Debian's chromium through Playwright (never `playwright install`).

`playwright` and `browser` are module fixtures a test module imports (`from ..helpers.browser import browser,
playwright`); `open_page` is a page in a fresh context that fails the test if the page threw; `screenshot` keeps
a full-page picture under tests/artifacts.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, Playwright, sync_playwright

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs it (apt-get install chromium)")
    with sync_playwright() as pw:
        yield pw


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    yield browser
    browser.close()


@contextmanager
def open_page(browser: Browser, height: int = 1100, timeout_ms: int = 30_000) -> Iterator[Page]:
    """A page 1400 px wide in a context of its own; what the page threw fails the test at the end."""
    context = browser.new_context(viewport={"width": 1400, "height": height})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.set_default_timeout(timeout_ms)
    yield page
    context.close()
    assert not errors, f"the page threw: {errors}"


def screenshot(page: Page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path), full_page=True)
    return path
