"""The dataset report panel in a real browser: the form's files and model, reported on every row, with the
histogram drawn by uPlot."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page

from tunestudio.settings import Settings
from tunestudio.worker.tiny_docs import write_docs

from ..helpers.pictures import chat, write_jsonl, write_picture
from ..helpers.planted import MAX_SEQ_LENGTH, Planted, write_planted
from ..helpers.server import loopback_v1, running_server
from ..helpers.teacher import Teacher
from . import test_web as web
from .test_web import screenshot

playwright, browser, page = web.playwright, web.browser, web.page  # test_web's browser fixtures, shared

pytestmark = pytest.mark.browser


@pytest.fixture
def planted(tmp_path: Path) -> Planted:
    folder = tmp_path / "data"
    folder.mkdir()
    return write_planted(folder)


@pytest.fixture
def server(tmp_path: Path, tiny_model: Path) -> Iterator[str]:
    settings = Settings(home=tmp_path / "home", dataset_roots=[tmp_path / "data"], model_roots=[tiny_model.parent])
    with running_server(settings) as url:
        yield url


@pytest.mark.timeout(300)
def test_the_report_panel_shows_the_planted_faults_and_a_histogram(planted: Planted, tiny_model: Path,
                                                                  server: str, page: Page) -> None:
    page.goto(server)
    page.locator("#f-model_name").fill(str(tiny_model))
    page.locator("#f-local_datasets").fill(str(planted.train))
    page.locator("#f-max_seq_length").fill(str(MAX_SEQ_LENGTH))
    page.locator("#report-run").click()
    page.locator("#report-summary").wait_for(timeout=180_000)
    assert page.locator("#report-refused-count").inner_text() == f"{len(planted.refused)} refused"
    assert [row.inner_text().split("\t")[0] for row in page.locator("#report-refused tbody tr").all()] == [
        f"train.jsonl:{line}" for line in sorted(planted.refused)]
    duplicates = page.locator("#report-duplicates").inner_text()
    assert f"{len(planted.exact)} exact" in duplicates and f"{len(planted.near)} near" in duplicates
    assert page.locator("#report-cut-rows").inner_text() == f"{len(planted.long)} rows"
    page.locator("#report-histogram canvas").wait_for()  # uPlot drew it
    points = page.locator("#report-histogram").get_attribute("data-points")
    assert points is not None and int(points) > 1
    # One click drops them in this job (issue 38, finding 8): near duplicates were found, so dedupe near (which
    # drops the exact ones too), and what is left is said from the report's own counts.
    assert page.locator("#f-dedupe").input_value() == '"off"'
    page.locator("#report-dedupe").click()
    assert page.locator("#f-dedupe").input_value() == '"near"'
    left = planted.usable - len(planted.exact) - len(planted.near)
    assert f"{left:,} of {planted.usable:,} rows are left" in page.locator("#report-dedupe-left").inner_text()
    assert page.locator("#report-dedupe").is_disabled()
    screenshot(page, "report-panel.png")

    # Image rows (issue 42): measured with a vision model's processor, their images' part shown, a broken
    # picture named by row, a picture shown twice, the row too long refused (never cut)
    vision = tiny_model.parent / "tiny-smolvlm"
    if not (vision / "config.json").is_file():
        return
    folder = planted.train.parent / "pictures"
    write_picture(folder / "a.png")
    (folder / "broken.png").write_text("not a picture")
    write_jsonl(folder / "rows.jsonl", [chat(["a.png"]), chat(["broken.png"]), chat(["a.png"], answer="again"),
                                        chat(["a.png"], answer=" ".join(["red"] * 400))])
    page.locator("#f-model_name").fill(str(vision))
    page.locator("#f-local_datasets").fill(str(folder / "rows.jsonl"))
    page.locator("#report-run").click()
    page.locator("#report-images").wait_for(timeout=180_000)
    assert page.locator("#report-unreadable-count").inner_text() == "1 unreadable or missing"
    assert [r.inner_text().split("\t")[:2] for r in page.locator("#report-unreadable tbody tr").all()] == [
        ["rows.jsonl:2", "1"]]
    assert page.locator("#report-image-repeats tbody tr").first.inner_text().split("\t")[:2] == ["a.png", "×3"]
    assert page.locator("#report-cut-rows").inner_text() == "1 rows"
    assert "refuses 1 rows (image rows are never cut)" in page.locator("#report-lengths").inner_text()
    page.locator("#report-panel").screenshot(path=str(screenshot(page, "report-images.png")))


@pytest.mark.timeout(180)
def test_make_data_previews_runs_and_hands_its_file_to_a_training_job(server: str, page: Page, tmp_path: Path) -> None:
    """Issue 43: the Make data view with the scripted teacher: Preview shows the rows, Run makes them as a job,
    and "Train on this data" opens the form on the output file."""
    docs = write_docs(tmp_path / "data" / "docs")
    out = tmp_path / "data" / "made" / "qa.jsonl"
    with loopback_v1(Teacher) as teacher:
        recipe = {"sources": [str(docs["md"]), str(docs["docx"])], "task": "qa", "rows": 3, "chunk_size": 300,
                  "chunk_overlap": 50, "output": str(out), "teacher": {"base_url": teacher, "model": "good"}}
        page.goto(server)
        page.locator("#nav-data").click()
        page.locator("#recipe").fill(json.dumps(recipe))
        page.locator("#preview-count").fill("2")
        page.locator("#preview-data").click()
        assert page.locator("#preview-summary").inner_text(timeout=60_000) == "2 kept, 0 removed by the gates"
        assert page.locator("#preview-rows .made-row").count() == 2 and not out.exists()
        pairs = {"sources": [str(docs["prompts"])], "task": "preference", "rows": 1, "output": str(out),
                 "teacher": {"base_url": teacher, "model": "good"},
                 "rejected_by": {"base_url": teacher, "model": "weak"}}
        page.locator("#recipe").fill(json.dumps(pairs))
        page.locator("#preview-count").fill("1")
        page.locator("#preview-data").click()
        page.locator("#preview-summary").filter(has_text="1 kept").wait_for(timeout=60_000)
        shown = page.locator("#preview-rows .made-row").inner_text()
        assert "chosen: Answer: How long" in shown and "rejected: I do not know." in shown
        page.locator("#recipe").fill(json.dumps(recipe))
        page.locator("#run-data").click()
        page.locator("#train-on-output").wait_for(timeout=60_000)
    assert page.locator("#make-progress").inner_text().startswith("3 / 3 rows")  # and what the gates rejected
    assert len(out.read_text().splitlines()) == 3
    page.locator("#train-on-output").click()
    page.wait_for_url("**/#/new")
    assert page.locator("#f-local_datasets").input_value() == str(out)
