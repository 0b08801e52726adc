"""The job page of a job early stopping ended: the watched metric's chart, its best step marked, in a real browser."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page

from tunestudio.jobs.manager import JobManager
from tunestudio.settings import Settings

from ..helpers import fake_workers
from ..helpers.browser import browser, open_page, playwright, screenshot  # noqa: F401  (module fixtures)
from ..helpers.jobs import DATA, job_config
from ..helpers.server import running_server
from ..helpers.wait import wait_until

pytestmark = pytest.mark.browser


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:  # noqa: F811
    with open_page(browser, timeout_ms=30_000) as page:
        yield page


def test_the_chart_marks_the_best_step_and_says_the_artefacts_are_its_weights(tmp_path: Path, page: Page) -> None:
    settings = Settings(home=tmp_path / "home", dataset_roots=[DATA, tmp_path], sse_heartbeat_seconds=0.5)
    manager = JobManager(settings, worker_target=fake_workers.stops_early)
    cfg = job_config("org/fake", tmp_path / "out", eval_steps=5, early_stopping={"metric": "exact_match"})
    with running_server(settings, manager) as url:
        with httpx.Client(base_url=url, timeout=30) as client:
            job_id = client.post("/api/jobs", json=cfg.public_dict()).json()["id"]
            wait_until(lambda: client.get(f"/api/jobs/{job_id}").json()["is_terminal"], 30, "the job's end")
        page.goto(f"{url}/#/jobs/{job_id}")
        page.locator('#job-status [data-status="completed"]').wait_for()
        assert page.locator("#job-message").inner_text() == fake_workers.EARLY_REASON
        best = page.locator("#best-step")
        assert best.inner_text() == ("Best at step 10: exact match 75.0% — the job's artefacts are this step's "
                                     "weights.")
        page.locator('#watch-chart[data-points="4"]').wait_for()  # one point per evaluation during training
        assert page.locator("#watch-chart").get_attribute("data-marks") == "10"
        assert page.locator("#loss-chart").get_attribute("data-marks") == "10"
        screenshot(page, "job-early-stopping.png")
    manager.close()
