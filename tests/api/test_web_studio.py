"""The studio in a real browser: upload → preview → estimate → start, the log after a restart, the config view
and Clone, name, delete, the status filter, and an axe-core run (no serious violations)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page

from tunestudio.jobs.manager import JobManager
from tunestudio.settings import Settings

from ..helpers import fake_workers
from ..helpers.jobs import DATA
from ..helpers.server import running_server
from . import test_web as web
from .test_web import SHORT, screenshot, wait_for_status

# test_web's browser fixtures, shared: pytest finds a fixture by its name in the module.
playwright, browser, page = web.playwright, web.browser, web.page

pytestmark = pytest.mark.browser

AXE = Path(__file__).resolve().parents[2] / "tunestudio" / "api" / "web" / "node_modules" / "axe-core" / "axe.min.js"
WORKER_COUNTS = re.compile(r"model: ([\d,]+) parameters, ([\d,]+) trainable")


def _settings(home: Path, models: Path) -> Settings:
    return Settings(home=home, dataset_roots=[DATA], model_roots=[models], sse_heartbeat_seconds=0.5,
                    sse_retry_ms=500)


@pytest.fixture
def quick_server(tmp_path: Path) -> Iterator[str]:
    """A server whose workers end at once (fake_workers.instant): for what is not about training."""
    settings = _settings(tmp_path / "home", tmp_path)
    manager = JobManager(settings, worker_target=fake_workers.instant)
    with running_server(settings, manager) as url:
        yield url
    manager.close()


def axe_serious(page: Page) -> list[str]:
    page.add_script_tag(path=str(AXE))
    found = page.evaluate("""async () => (await axe.run(document, {resultTypes: ['violations']})).violations
        .filter((v) => v.impact === 'serious' || v.impact === 'critical')
        .map((v) => `${v.id}: ${v.nodes.map((n) => n.target.join(' ')).join(', ')}`)""")
    return found


@pytest.mark.timeout(900)
def test_upload_preview_estimate_start_then_the_log_after_a_restart(tmp_path: Path, tiny_model: Path,
                                                                    page: Page) -> None:
    home = tmp_path / "home"
    dataset = tmp_path / "my rows.jsonl"
    dataset.write_text((DATA / "alpaca.jsonl").read_text())
    with running_server(_settings(home, tiny_model.parent)) as url:
        page.goto(url)
        page.locator("#f-model_name").fill(str(tiny_model))
        page.locator("#upload-input").set_input_files(str(dataset))
        page.locator("#upload-status").filter(has_text="Stored as my_rows.jsonl").wait_for()
        stored = home.resolve() / "data" / "uploads" / "my_rows.jsonl"
        assert page.locator("#f-local_datasets").input_value() == str(stored)
        page.locator("#preview-format").filter(has_text="alpaca").wait_for(timeout=90_000)  # previewed at once
        page.locator('#uploads [data-upload="my_rows.jsonl"]').wait_for(state="attached")  # listed for reuse
        for name, value in SHORT.items():
            page.locator(f"#f-{name}").fill(str(value))
        page.locator("#advanced summary").click()
        page.locator("#f-sample_prompts").fill("Reverse the letters of the word.\n\ngarden")
        page.locator("#estimate-fit").filter(has_text="Fits").wait_for()
        page.locator("#estimate-total-time").filter(has_text="in all").wait_for()  # max_steps set: a total
        memory = page.locator("#estimate-total").inner_text()  # was the seconds in all, or "null", in "B"
        assert re.fullmatch(r"\d+(\.\d+)? (MiB|GiB)", memory), memory
        assert page.locator("#estimate-basis li").count() >= 3  # what the time rests on, one line each
        screenshot(page, "studio-form-upload-estimate.png")
        page.locator("#start").click()
        page.wait_for_url("**/#/jobs/*")
        job_id = page.locator(".job-view").get_attribute("data-job-id")
        wait_for_status(page, "completed")
        page.locator("#log-card summary").click()
        page.locator("#log-text").filter(has_text="trainable").wait_for()
        page.locator("#samples tbody tr").first.wait_for()  # before/after, from the completed event
        assert page.locator("#samples tbody tr").count() == 2
        # the estimate as it stood before Start, against the step time the job measured
        versus = page.locator("#estimate-versus")
        versus.filter(has_text="Estimated before start").wait_for()
        assert float(versus.get_attribute("data-ratio") or 0) > 0

        with httpx.Client(base_url=url, timeout=30) as client:
            job = client.get(f"/api/jobs/{job_id}").json()
            assert job["config"]["local_datasets"] == [str(stored)]
            assert job["progress"]["peak_memory_mb"] > 50  # the worker's own peak (RSS here), in every record
            estimate = client.post("/api/models/estimate", json=job["config"]).json()
            log = client.get(f"/api/jobs/{job_id}/log").text
        # The estimate's arithmetic against the worker's own count of the loaded model (base + adapters).
        total, trainable = (int(x.replace(",", "")) for x in WORKER_COUNTS.search(log).groups())
        assert estimate["trainable"] == trainable
        assert estimate["parameters"] + estimate["trainable"] == total

    # A new server on the same data directory: the finished job's log is still there.
    with running_server(_settings(home, tiny_model.parent)) as url:
        page.goto(f"{url}/#/jobs/{job_id}")
        wait_for_status(page, "completed")
        page.locator("#log-card summary").click()
        page.locator("#log-text").filter(has_text="trainable").wait_for()
        assert page.locator("#log-download").get_attribute("href").endswith(f"/api/jobs/{job_id}/log?download=true")
        # what the worker decided, beside the config: the layers LoRA adapted (the tiny Llama's linears)
        page.locator("#config-card summary").click()
        targets = page.locator('#job-resolved tr[data-key="lora_targets"] td').inner_text()
        assert re.fullmatch(r"\d+ layers \((\w+, )*q_proj(, \w+)*\)", targets), targets
        assert page.locator('#job-resolved tr[data-key="precision"]').is_visible()
        screenshot(page, "studio-job-log-after-restart.png")


@pytest.mark.timeout(300)
def test_config_view_clone_name_filter_and_delete(quick_server: str, page: Page) -> None:
    config = {"model_name": "org/model", "local_datasets": [str(DATA / "alpaca.jsonl")], "batch_size": 3,
              "learning_rate": 0.001, "max_steps": 5}
    with httpx.Client(base_url=quick_server, timeout=30) as client:
        other = client.post("/api/jobs", json={**config, "batch_size": 4}).json()["id"]
        job_id = client.post("/api/jobs", json=config).json()["id"]
    page.goto(f"{quick_server}/#/compare/{other},{job_id}")
    page.locator('#config-diff tr[data-key="batch_size"]').wait_for()  # the one field they differ on
    assert page.locator("#config-diff tbody tr").count() == 1
    page.goto(f"{quick_server}/#/jobs/{job_id}")
    wait_for_status(page, "completed")

    page.locator("#config-card summary").click()
    assert page.locator('#job-config tr[data-key="batch_size"]').get_attribute("class") == "set"
    assert page.locator('#job-config tr[data-key="weight_decay"]').get_attribute("class") == "default"  # greyed

    page.locator("#job-name").fill("small batch")
    page.locator("#job-save").click()
    page.locator(f'.job-row[data-job-id="{job_id}"] .cell-model').filter(has_text="small batch").wait_for()
    assert page.locator("#job-title").inner_text() == "small batch"

    page.locator("#status-filter").select_option("failed,cancelled")
    page.locator(f'.job-row[data-job-id="{job_id}"]').wait_for(state="detached")
    page.locator("#status-filter").select_option("completed")
    page.locator(f'.job-row[data-job-id="{job_id}"]').wait_for()

    page.locator("#clone").click()
    page.wait_for_url("**/#/new")
    assert page.locator("#f-batch_size").input_value() == "3"
    assert page.locator("#f-learning_rate").input_value() == "0.001"
    assert page.locator("#f-max_steps").input_value() == "5"
    # A number the browser cannot read is an error next to its field, not a silent default.
    page.locator("#f-num_epochs").fill("1e")  # a text field since issue 32: read exactly as typed
    page.locator("#start").click()
    page.locator('[data-error-for="num_epochs"]').filter(has_text="not a number").wait_for()
    assert page.evaluate("() => document.activeElement.id") == "f-num_epochs"  # focus moved to it

    page.goto(f"{quick_server}/#/jobs/{job_id}")
    page.locator("#delete").click()
    page.locator("#confirm").wait_for()
    page.locator("#delete-artefacts").check()
    page.locator("#confirm-yes").click()
    page.wait_for_url("**/#/new")
    page.locator(f'.job-row[data-job-id="{job_id}"]').wait_for(state="detached")
    with httpx.Client(base_url=quick_server, timeout=30) as client:
        assert client.get(f"/api/jobs/{job_id}").status_code == 404


@pytest.mark.timeout(300)
def test_axe_finds_no_serious_violations(quick_server: str, page: Page) -> None:
    with httpx.Client(base_url=quick_server, timeout=30) as client:
        job_id = client.post("/api/jobs", json={"model_name": "org/model", "max_steps": 3,
                                                "local_datasets": [str(DATA / "alpaca.jsonl")]}).json()["id"]
    page.goto(quick_server)
    page.locator("#preview-format").wait_for(timeout=90_000)
    page.locator("#advanced summary").click()
    assert axe_serious(page) == []
    page.goto(f"{quick_server}/#/jobs/{job_id}")
    wait_for_status(page, "completed")
    assert axe_serious(page) == []
    page.locator("#theme-toggle").click()
    assert axe_serious(page) == []
    screenshot(page, "studio-job-dark.png")
