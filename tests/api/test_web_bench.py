"""The job page's Benchmarks panel in a real browser: run one from the form, read its figures with the difference's
error bar. The workers are scripted (a benchmark's real run is tests/api/test_benchmarks.py)."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page

from tunestudio.jobs.manager import JobManager
from tunestudio.settings import Settings
from tunestudio.worker import child
from tunestudio.worker.child import WorkerArgs

from ..helpers.jobs import DATA
from ..helpers.server import running_server
from . import test_web as web
from .test_web import screenshot, wait_for_status
from .test_web_studio import axe_serious

playwright, browser, page = web.playwright, web.browser, web.page
pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

FIGURES = {"harness": "lm-eval 0.4.13", "models": {"before": "J:base", "after": "J"}, "limit": 20,
           "chat_template": True,
           "tasks": {"tunestudio_lookup": {"version": 1.0, "samples": 20, "metrics": {
               "acc": {"before": 0.25, "after": 0.6, "difference": 0.35, "stderr": 0.14, "stderr_before": 0.1,
                       "stderr_after": 0.1}}}}}


def scripted(args: WorkerArgs) -> None:
    """A training job completes at once; a benchmark reports FIGURES after its phases."""
    child.become_worker(dataclasses.replace(args, log_path=None))
    seq = 0

    def emit(kind: str, **fields: object) -> None:
        nonlocal seq
        seq += 1
        args.events.put(json.dumps({"kind": kind, "seq": seq, "ts": time.time(), **fields}))

    if args.kind == "bench":
        emit("phase", phase="loading_dataset")
        emit("phase", phase="evaluating_base", done=0, total=1)
        emit("phase", phase="saving")
        emit("completed", output_dir=None, benchmarks=FIGURES)
    else:  # a "full model" to measure: what the chat models' lookup needs (inference/models.py)
        (Path(args.public_config["output_dir"]) / "config.json").write_text("{}")
        emit("phase", phase="training")
        emit("progress", step=1, total_steps=1, loss=1.0)
        emit("completed", output_dir=None, global_step=1)
    args.events.close()
    args.events.join_thread()
    sys.exit(0)


@pytest.fixture
def server(tmp_path: Path, tiny_model: Path) -> Iterator[str]:
    settings = Settings(home=tmp_path / "home", dataset_roots=[DATA], sse_heartbeat_seconds=0.5, sse_retry_ms=500)
    manager = JobManager(settings, worker_target=scripted)
    with running_server(settings, manager) as url:
        yield url
    manager.close()


def test_a_benchmark_run_from_the_panel_shows_before_after_and_the_error_bar(server: str, page: Page,
                                                                             tiny_model: Path) -> None:
    with httpx.Client(base_url=server, timeout=30) as client:
        job_id = client.post("/api/jobs", json={"model_name": str(tiny_model), "max_steps": 1,
                                                "local_datasets": [str(DATA / "alpaca.jsonl")]}).json()["id"]
    page.goto(f"{server}/#/jobs/{job_id}")
    wait_for_status(page, "completed")
    page.locator("#bench-start").click()
    page.locator("#bench-error").wait_for(state="visible")
    assert "tasks" in page.locator("#bench-error").text_content()  # neither tasks nor an eval file
    page.locator("#bench-tasks").fill("arc_easy, hellaswag")
    page.locator("#bench-limit").fill("20")
    page.locator("#bench-start").click()
    row = page.locator('.bench-run[data-status="completed"] tr[data-metric="acc"]')
    row.wait_for(timeout=60_000)
    assert row.locator(".bench-before").text_content().startswith("0.25")
    assert row.locator(".bench-difference").text_content().startswith("+0.35")
    assert row.locator("svg.bench-bar line.bench-whisker").count() == 3
    listed = httpx.get(f"{server}/api/jobs/{job_id}/benchmarks", timeout=30).json()["benchmarks"]
    assert [b["tasks"] for b in listed] == [["arc_easy", "hellaswag"]] and listed[0]["limit"] == 20
    assert axe_serious(page) == []
    screenshot(page, "job-benchmarks.png")
    # The benchmark's own page: its figures, and the job it measured.
    page.goto(f"{server}/#/jobs/{listed[0]['id']}")
    page.locator("#bench-result tr[data-metric='acc']").wait_for(timeout=30_000)
    assert page.locator(f'.job-head a[href="#/jobs/{job_id}"]').count() == 1
