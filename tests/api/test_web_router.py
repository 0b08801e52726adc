"""The page's router in a real browser: a view still loading when the user moves on never replaces the newer view
(the form waits for its defaults; the sweep list came, then the form's defaults, and the form took the page)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, Route

from tunestudio.settings import Settings

from ..helpers.browser import browser, open_page, playwright  # noqa: F401  (module fixtures)
from ..helpers.jobs import DATA
from ..helpers.server import running_server

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:  # noqa: F811
    with open_page(browser) as page:
        yield page


def test_a_view_that_loads_after_the_user_moved_on_does_not_take_the_page(tmp_path: Path, page: Page) -> None:
    settings = Settings(home=tmp_path / "home", dataset_roots=[DATA, tmp_path], prewarm=False)
    held: list[Route] = []
    with running_server(settings) as url:
        # the form's first request waits until released
        page.route("**/api/web/defaults", lambda route: held.append(route))
        page.goto(f"{url}/#/new")
        page.wait_for_function("() => document.body.dataset.view === 'new'")
        assert page.locator("#new-job").count() == 0 and len(held) == 1
        page.locator("#nav-sweeps").click()
        page.locator("#no-sweeps").wait_for()
        with page.expect_response("**/api/web/defaults"):
            held[0].continue_()
        page.evaluate("() => new Promise((done) => setTimeout(done, 100))")  # the form's continuation has run
        assert page.locator("#no-sweeps").is_visible()
        assert page.locator("#new-job").count() == 0
        page.unroute("**/api/web/defaults")
        page.locator("#nav-new").click()
        page.locator("#new-job").wait_for()  # the form still comes when it is the view
