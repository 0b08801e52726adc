"""The web page's browser tests: Debian's chromium through Playwright (never `playwright install`).

`playwright` and `browser` are module fixtures a test module imports (`from ..helpers.browser import browser,
playwright`); `open_page` is a page in a fresh context that fails the test if the page threw; `screenshot` keeps
a full-page picture under tests/artifacts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, Playwright, sync_playwright
from playwright.sync_api import TimeoutError as PlaywrightTimeout

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


def narrowed(page: Page, width: int = 390, height: int = 844, timeout_ms: int = 10_000) -> int:
    """Resize the viewport, then wait (a deadline, not a sleep) until the page fits it: a chart follows its box
    through a ResizeObserver, a frame after the resize, so a measure taken at once can see the old width.
    Returns the page's scroll width; the caller asserts it."""
    page.set_viewport_size({"width": width, "height": height})
    with contextlib.suppress(PlaywrightTimeout):  # the caller's assertion names the width
        page.wait_for_function(f"() => document.scrollingElement.scrollWidth <= {width}", timeout=timeout_ms)
    return page.evaluate("() => document.scrollingElement.scrollWidth")
