"""A sweep's page in a real browser: the leaderboard ranked by the objective, the objective against each swept
parameter, and the best trial cloned to the form, exported and chatted with (scripted trials, a real server)."""

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
from ..helpers.jobs import DATA
from ..helpers.server import running_server
from ..helpers.wait import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

SWEEP = {"base": {"model_name": "org/model", "local_datasets": [str(DATA / "alpaca.jsonl")], "max_steps": 6,
                  "eval_steps": 2},
         "space": {"learning_rate": {"values": [1e-2, 1e-3, 1e-4]}, "lora_r": {"values": [4, 16]}},
         "sampler": "grid", "n_trials": 6, "objective": {"metric": "eval_loss", "mode": "min"}, "parallel": 2}


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:  # noqa: F811
    with open_page(browser) as page:
        yield page


@pytest.fixture
def sweep_server(tmp_path: Path) -> Iterator[tuple[str, dict]]:
    settings = Settings(home=tmp_path / "home", dataset_roots=[DATA, tmp_path], prewarm=False, max_concurrent_jobs=2)
    manager = JobManager(settings, worker_target=fake_workers.sweep_trial)
    with running_server(settings, manager) as url, httpx.Client(base_url=url, timeout=30) as client:
        created = client.post("/api/sweeps", json=SWEEP)
        assert created.status_code == 201, created.text
        sweep_id = created.json()["id"]
        wait_until(lambda: client.get(f"/api/sweeps/{sweep_id}").json()["status"] == "completed", 120, "the sweep")
        yield url, client.get(f"/api/sweeps/{sweep_id}").json()
    manager.close()


def test_the_leaderboard_ranks_plots_and_hands_on_the_best_trial(sweep_server: tuple[str, dict], page: Page) -> None:
    url, sweep = sweep_server
    best = sweep["best"]
    assert best["params"] == {"learning_rate": 1e-3, "lora_r": 16}
    page.goto(f"{url}/#/new")
    page.locator("#nav-sweeps").click()
    page.locator(f'#sweep-list tr[data-sweep="{sweep["id"]}"] a').click()
    page.wait_for_url(f"**/#/sweeps/{sweep['id']}")
    page.locator('#sweep-status [data-status="completed"]').wait_for()

    rows = page.locator("#leaderboard tbody tr")
    assert rows.count() == 6
    assert [int(n) for n in rows.evaluate_all("rs => rs.map(r => r.dataset.trial)")] == [
        t["number"] for t in sweep["trials"]]
    values = [float(v) for v in page.locator("#leaderboard td.value").all_inner_texts()]
    assert values == sorted(values) and values[0] == pytest.approx(best["value"], rel=1e-3)
    assert rows.first.get_attribute("class") == "best"
    assert set(rows.evaluate_all("rs => rs.map(r => r.dataset.status)")) == {"completed"}
    assert page.locator("#leaderboard thead th").all_inner_texts()[2:4] == ["learning_rate", "lora_r"]
    # one chart per swept parameter, a point per trial with a value
    for name in ("learning_rate", "lora_r"):
        page.locator(f'#plot-{name}[data-points="6"]').wait_for()
        assert page.locator(f"#plot-{name}").get_attribute("data-trials") == "6"
    assert page.locator("#best-job").inner_text() == best["job_id"]
    screenshot(page, "sweep-leaderboard.png")

    page.locator("#best-chat").click()
    page.locator(f'#best-chat-panel .chat-log[data-model="{best["job_id"]}"]').wait_for()
    page.locator("#best-chat-panel #chat-input").wait_for()
    page.locator("#best-export").click()
    page.locator("#best-export-panel #export-form").wait_for()
    assert page.locator("#best-chat-panel").count() == 0  # one panel at a time

    page.locator("#best-clone").click()
    page.wait_for_url("**/#/new")
    page.locator("#f-learning_rate").wait_for()
    assert page.locator("#f-learning_rate").input_value() == "0.001"
    assert page.locator("#f-lora_r").input_value() == "16"
    assert page.locator("#f-max_steps").input_value() == "6"
