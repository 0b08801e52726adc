"""Deleting a job with its exports in a real browser (issue 30): the page asks about the exports by name, both go,
and only what they wrote goes: a file the user put in either folder stays."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page

from tunestudio.jobs.manager import JobManager
from tunestudio.settings import Settings

from ..helpers import fake_workers
from ..helpers.browser import browser, open_page, playwright  # noqa: F401  (module fixtures)
from ..helpers.jobs import DATA, job_config
from ..helpers.server import running_server
from ..helpers.wait import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]
JSON = {"Content-Type": "application/json"}


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:  # noqa: F811
    with open_page(browser) as page:
        yield page


def completed(client: httpx.Client, response: httpx.Response) -> dict:
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    job = wait_until(lambda: (j := client.get(f"/api/jobs/{job_id}").json())["is_terminal"] and j, 30,
                     f"job {job_id} to end")
    assert job["status"] == "completed", job
    return job


def test_deleting_a_job_asks_about_its_exports_and_keeps_the_users_files(tmp_path: Path, page: Page) -> None:
    settings = Settings(home=tmp_path / "home", dataset_roots=[DATA, tmp_path], prewarm=False)
    manager = JobManager(settings, worker_target=fake_workers.writes_output)
    run = tmp_path / "run"
    with running_server(settings, manager) as url, httpx.Client(base_url=url, timeout=30) as client:
        config = {k: v for k, v in job_config("org/fake", run).public_dict().items() if v is not None}
        source = completed(client, client.post("/api/jobs", json=config, headers=JSON))
        export = completed(client, client.post(f"/api/jobs/{source['id']}/exports", json={"target": "merged"},
                                               headers=JSON))
        exported = Path(export["output_dir"])
        assert exported.is_relative_to(run) and (exported / "weights.bin").is_file()
        (run / "notes.txt").write_text("the user's")
        (exported / "readme.txt").write_text("the user's")

        page.goto(f"{url}/#/jobs/{source['id']}")
        page.locator("#delete").click()
        page.locator("#confirm").wait_for()
        label = page.locator("label.confirm-extra").inner_text()
        assert "files it wrote" in label and "stay" in label and "output folder" not in label
        page.locator("#delete-artefacts").check()
        page.locator("#confirm-yes").click()
        # The server names the export that has files; the page asks again, naming it.
        page.locator("#confirm-title").filter(has_text="Delete its exports too?").wait_for()
        question = page.locator("#confirm-text").inner_text()
        assert export["id"] in question and "stay" in question, question
        page.locator("#confirm-yes").click()
        page.wait_for_url("**/#/new")

        for job_id in (source["id"], export["id"]):
            assert client.get(f"/api/jobs/{job_id}").status_code == 404
        assert not (run / "weights.bin").exists() and not (run / "checkpoint-1").exists()
        assert not (exported / "weights.bin").exists()
        assert (run / "notes.txt").read_text() == "the user's"
        assert (exported / "readme.txt").read_text() == "the user's"
    manager.close()
