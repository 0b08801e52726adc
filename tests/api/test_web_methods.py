"""The page's training-method choice and method charts, in a real browser (fixtures from test_web)."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Page

from ..helpers.jobs import DATA
from .test_web import browser, page, playwright, screenshot, server, wait_for_status  # noqa: F401

pytestmark = pytest.mark.browser


@pytest.mark.timeout(600)
def test_a_dpo_job_from_the_form_charts_its_reward_margin(tiny_model: Path, server: str, page: Page) -> None:  # noqa: F811
    page.goto(server)
    page.locator("#f-model_name").fill(str(tiny_model))
    # GRPO's options show for GRPO only; DPO's for DPO.
    page.locator('.training-methods input[value="grpo"]').check(force=True)
    assert page.locator('.field[data-field="num_generations"]').is_visible()
    page.locator('.training-methods input[value="dpo"]').check(force=True)
    assert page.locator('.field[data-field="num_generations"]').is_hidden()
    assert page.locator('.field[data-field="beta"]').is_visible()
    page.locator("#f-local_datasets").fill(str(DATA / "preference.jsonl"))
    page.locator("#preview-format").filter(has_text="preference").wait_for(timeout=90_000)
    assert "chosen · assistant" in page.locator("#preview").inner_text()
    # Eval off: the form evaluates by default (issue 38), which costs a DPO job here about 6 s and is not this
    # test's subject (test_web.py's form job checks the before/after table).
    for name, value in {"max_steps": 6, "batch_size": 4, "max_seq_length": 64, "logging_steps": 1,
                        "gradient_accumulation_steps": 1, "learning_rate": 1e-3, "beta": 0.2, "eval_steps": 0}.items():
        page.locator(f"#f-{name}").fill(str(value))
    page.locator("#start").click()

    page.wait_for_url("**/#/jobs/*")
    wait_for_status(page, "completed")
    chart = page.locator("#method-chart")
    assert (chart.get_attribute("data-series") or "").startswith("rewards/margins")
    page.wait_for_function("() => Number(document.querySelector('#method-chart').dataset.points) === 6")
    assert page.locator("#stat-method").inner_text() != "–"
    job = page.evaluate("() => window.tunestudio.series.latest")
    assert "rewards/margins" in job["extra"]
    screenshot(page, "job-dpo-method-chart.png")
