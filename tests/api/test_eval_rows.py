"""A finished job's held-out rows one by one (GET /api/jobs/{id}/rows and the job page's panel), on a real tiny-model
job: worst first by loss or by a generation metric, paged; 404 for an unknown job, 409 saying why for a job without
rows; Clone to form holds out the same rows. An image job's rows (a fake worker's rows file) come with their pictures,
which the page shows beside the prompt."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, Route

from tunestudio.events import HELD_OUT_FILE
from tunestudio.jobs.manager import JobManager
from tunestudio.settings import Settings

from ..helpers import fake_workers
from ..helpers.browser import ARTIFACTS, browser, open_page, playwright, screenshot  # noqa: F401  (module fixtures)
from ..helpers.jobs import DATA, job_config
from ..helpers.server import running_server
from ..helpers.wait import wait_until
from .test_web import SHORT

ANSWERED = 6


@dataclass
class Finished:
    url: str
    job_id: str
    job: dict
    rows: list[dict]  # every row, in held-out order


@pytest.fixture(scope="module")
def finished(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Finished]:
    home = tmp_path_factory.mktemp("rows-home")
    settings = Settings(home=home, dataset_roots=[DATA, home], sse_heartbeat_seconds=0.5)
    config = {"model_name": str(tiny_model), "local_datasets": [str(DATA / "alpaca.jsonl")], **SHORT,
              "max_steps": 20, "eval_steps": 10, "eval_generate_rows": ANSWERED, "random_seed": 5}
    with running_server(settings) as url, httpx.Client(base_url=url, timeout=30) as client:
        created = client.post("/api/jobs", json=config)
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
        wait_until(lambda: client.get(f"/api/jobs/{job_id}").json()["is_terminal"], 600, "the job's end")
        job = client.get(f"/api/jobs/{job_id}").json()
        assert job["status"] == "completed", job["error"]
        everything = client.get(f"/api/jobs/{job_id}/rows", params={"order": "worst", "limit": 1000}).json()
        rows = sorted(everything["rows"], key=lambda r: r["index"])
        yield Finished(url, job_id, job, rows)


@pytest.mark.timeout(900)  # the module's real job is trained on first use
def test_the_rows_come_worst_first_by_loss_or_a_metric_a_page_at_a_time(finished: Finished) -> None:
    job = finished.job
    held = json.loads(Path(job["held_out"]["file"]).read_text())["rows"]
    assert job["held_out"]["rows"] == len(held) == 20 and job["held_out"]["seed"] == 5
    assert job["evaluation"]["scored_rows"] == 20 and job["evaluation"]["rows"] == ANSWERED
    # every held-out row, at its place in the data, with its reference and both losses
    rows = finished.rows
    assert [(r["file"], r["line"]) for r in rows] == [(e["file"], e["line"]) for e in held]
    lines = (DATA / "alpaca.jsonl").read_text().splitlines()
    assert all(r["reference"] == json.loads(lines[r["line"] - 1])["output"] for r in rows)
    assert all(r["loss"] > 0 and r["loss_before"] > 0 for r in rows)
    assert sum(r["answer"] is not None for r in rows) == ANSWERED
    assert sum(r["loss"] for r in rows) < sum(r["loss_before"] for r in rows)  # training lowered them

    with httpx.Client(base_url=finished.url, timeout=30) as client:
        def get(**params: object) -> dict:
            answer = client.get(f"/api/jobs/{finished.job_id}/rows", params=params)
            assert answer.status_code == 200, answer.text
            return answer.json()

        worst = get(order="worst")
        assert worst["total"] == worst["ranked"] == 20 and worst["by"] == "loss"
        assert worst["rows"][0]["loss"] == max(r["loss"] for r in rows)  # the worst row's loss >= every other's
        losses = [r["loss"] for r in get(order="worst", limit=1000)["rows"]]
        assert losses == sorted(losses, reverse=True)
        assert [r["loss"] for r in get(order="best", limit=1000)["rows"]] == sorted(losses)
        page = get(order="worst", limit=5, offset=5)
        assert [r["loss"] for r in page["rows"]] == losses[5:10] and page["offset"] == 5 and page["limit"] == 5

        by_rouge = get(order="worst", by="rouge_l", limit=1000)
        assert by_rouge["ranked"] == ANSWERED
        scores = [r["rouge_l"] for r in by_rouge["rows"][:ANSWERED]]
        assert scores == sorted(scores) and all(r["rouge_l"] is None for r in by_rouge["rows"][ANSWERED:])

        assert client.get("/api/jobs/nope/rows").status_code == 404
        assert client.get(f"/api/jobs/{finished.job_id}/rows", params={"by": "nonsense"}).status_code == 422

        # a job without rows (yet, and after: it holds none out): a 409 that says why
        created = client.post("/api/jobs", json={**finished.job["config"], "output_dir": None, "max_steps": 2,
                                                  "eval_steps": 0})
        other = created.json()["id"]
        refused = client.get(f"/api/jobs/{other}/rows")
        assert refused.status_code == 409
        assert "the rows are measured by its final evaluation, when it completes" in refused.json()["detail"]["message"]
        wait_until(lambda: client.get(f"/api/jobs/{other}").json()["is_terminal"], 600, "the second job's end")
        assert client.get(f"/api/jobs/{other}").json()["status"] == "completed"
        refused = client.get(f"/api/jobs/{other}/rows")
        assert refused.status_code == 409
        assert refused.json()["detail"]["message"] == (
            f"job {other} has no evaluation rows: it held out no rows to evaluate: set eval_steps above 0 (a dataset "
            "of 32 rows or more holds rows out) or name an eval_split")


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:  # noqa: F811
    with open_page(browser) as page:
        yield page


@pytest.mark.browser
@pytest.mark.timeout(900)
def test_the_job_page_lists_its_rows_worst_first_and_a_clone_holds_them_out_again(finished: Finished,
                                                                                  page: Page) -> None:
    page.goto(f"{finished.url}/#/jobs/{finished.job_id}")
    page.locator("#fold-rows summary").click()  # 20 rows of text: folded at first, below the charts
    table = page.locator("#rows-table tbody tr")
    page.locator("#rows-note").filter(has_text="20 of 20 rows, worst loss first").wait_for()
    shown = [float(x) for x in table.evaluate_all("rows => rows.map(r => r.dataset.loss)")]
    assert len(shown) == 20 and shown == sorted(shown, reverse=True)
    assert shown[0] == max(r["loss"] for r in finished.rows)
    worst = max(finished.rows, key=lambda r: r["loss"])
    first = table.first
    assert first.get_attribute("data-index") == str(worst["index"])
    assert worst["reference"] in first.inner_text() and f"alpaca.jsonl:{worst['line']}" in first.inner_text()
    screenshot(page, "job-eval-rows.png")

    page.locator("#rows-order").select_option("best")
    page.locator("#rows-note").filter(has_text="best loss first").wait_for()
    assert float(table.first.get_attribute("data-loss") or "nan") == min(r["loss"] for r in finished.rows)

    page.locator("#rows-by").select_option("rouge_l")
    page.locator("#rows-note").filter(has_text=f"({20 - ANSWERED} not answered come last)").wait_for()
    answered = next(r for r in finished.rows if r["answer"] is not None)
    assert page.locator("#rows-table").filter(has_text=answered["answer"] or "(empty)").count() == 1

    page.locator("#config-card summary").click()
    page.locator("#clone").click()
    page.wait_for_url("**/#/new")
    assert page.locator("#f-held_out_rows").input_value() == finished.job["held_out"]["file"]
    assert finished.job["held_out"]["file"].endswith(HELD_OUT_FILE)


# --- issue 38: what the page writes (2), where the chart is (7), the badge (12), the job list's names (13) -------
# Text nodes that read null, undefined or NaN: a null child handed to the DOM, or a figure that is not one.
# A model's answers and a file's rows (pre, code, textarea) and the logs may say anything.
STRAY_TEXT = """() => {
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const found = [];
  while (walker.nextNode()) {
    const node = walker.currentNode;
    if (node.parentElement.closest("pre, code, textarea, script, style, #events-log, #log-file")) continue;
    if (/\\b(null|undefined|NaN)\\b|\\[object Object\\]/.test(node.data)) {
      found.push(`${node.parentElement.tagName}#${node.parentElement.id}: ${node.data.trim().slice(0, 60)}`);
    }
  }
  return found;
}"""
# Every table with headings: as many columns in its heading row as in each of its rows. A text node in a row is a
# column of its own on the screen (the browser wraps it in a cell): "null" there shifted every heading after it.
UNEVEN_TABLES = """() => [...document.querySelectorAll("table")].filter((t) => t.tHead && t.tHead.rows.length)
  .flatMap((t) => {
    const width = (row) => [...row.childNodes].reduce((n, node) => n + (node.nodeType === Node.TEXT_NODE
      ? (node.data.trim() ? 1 : 0) : node.colSpan || 0), 0);
    const head = width(t.tHead.rows[t.tHead.rows.length - 1]);
    return [...t.tBodies].flatMap((b) => [...b.rows]).filter((r) => width(r) !== head)
      .map((r) => `${t.id || t.className}: ${head} headings over ${width(r)} cells`);
  })"""
HEADINGS = "(table) => [...table.tHead.rows[0].cells].map((c) => c.textContent)"


def column(page: Page, heading: str) -> dict[str, str]:
    """What the held-out rows table shows under `heading` on the screen, by row index."""
    return dict(page.locator("#rows-table").evaluate(
        """(table, heading) => {
          const th = [...table.tHead.rows[0].cells].find((c) => c.textContent === heading).getBoundingClientRect();
          const x = th.left + th.width / 2;
          return [...table.tBodies[0].rows].map((r) => [r.dataset.index, [...r.cells].find((c) => {
            const box = c.getBoundingClientRect();
            return box.left <= x && x < box.right;
          })?.textContent]);
        }""", heading))


def assert_answers_under_their_models(page: Page, finished: Finished) -> None:
    tuned, base = column(page, "fine-tuned"), column(page, "base model")
    for row in finished.rows:
        if str(row["index"]) in tuned and row["answer"] is not None:
            assert tuned[str(row["index"])] == (row["answer"] or "(empty)")
            assert base[str(row["index"])] == (row["answer_before"] or "(empty)")
    references = column(page, "reference")
    assert all(references[str(r["index"])] == r["reference"] for r in finished.rows if str(r["index"]) in references)


@pytest.mark.browser
@pytest.mark.timeout(900)
def test_the_page_writes_no_null_and_its_headings_stand_over_their_columns(finished: Finished, page: Page) -> None:
    # A finished job: the loss chart and the before/after figures in the first screen, the rest folded below
    page.goto(f"{finished.url}/#/jobs/{finished.job_id}")
    page.locator("#evaluation").wait_for()
    page.locator("#export-panel").wait_for()
    height = page.evaluate("() => window.innerHeight")
    assert page.locator("#loss-chart").bounding_box()["y"] < height
    assert page.locator("#evaluation").bounding_box()["y"] < height
    assert page.locator("#fold-chat").get_attribute("open") is not None
    assert page.locator("#fold-rows").get_attribute("open") is None
    page.locator("#fold-rows summary").click()
    page.locator("#rows-note").filter(has_text="20 of 20 rows").wait_for()
    assert page.evaluate(STRAY_TEXT) == [] and page.evaluate(UNEVEN_TABLES) == []
    assert page.locator("#rows-table").evaluate(HEADINGS) == [
        "row", "loss (base → tuned)", "prompt", "reference", "fine-tuned", "base model"]
    assert_answers_under_their_models(page, finished)  # by loss: the answered rows among the 20
    page.locator("#rows-by").select_option("rouge_l")
    page.locator("#rows-note").filter(has_text="ROUGE-L first").wait_for()
    assert page.locator("#rows-table").evaluate(HEADINGS) == [
        "row", "loss (base → tuned)", "ROUGE-L", "prompt", "reference", "fine-tuned", "base model"]
    assert_answers_under_their_models(page, finished)
    assert page.evaluate(STRAY_TEXT) == [] and page.evaluate(UNEVEN_TABLES) == []
    screenshot(page, "job-sections.png")

    # The form, with a dataset's preview
    page.goto(finished.url)
    page.locator("#f-local_datasets").fill(str(DATA / "alpaca.jsonl"))
    page.locator("#preview-format").wait_for(timeout=90_000)
    page.locator("#estimate-fit").wait_for(timeout=60_000)
    assert page.evaluate(STRAY_TEXT) == [] and page.evaluate(UNEVEN_TABLES) == []


@pytest.mark.browser
@pytest.mark.timeout(900)
def test_the_job_list_tells_alike_names_apart_and_badges_say_the_step(finished: Finished, page: Page) -> None:
    names = [*(f"stop and resume a long run, take {n}" for n in (1, 2, 3)),
             "stop and resume a long run on the bundled alpaca rows, take 4"]

    def listed(route: Route) -> None:
        real = route.fetch().json()
        job = next(j for j in real["items"] if j["id"] == finished.job_id)
        alike = [{**job, "id": f"{job['id']}{n}", "name": name} for n, name in enumerate(names)]
        # evaluating the base model: its status is still loading_dataset, its phase the step
        running = {**job, "id": f"{job['id']}run", "name": "running", "status": "loading_dataset",
                   "phase": "evaluating_base", "is_terminal": False}
        route.fulfill(json={**real, "items": [*alike, running], "total": len(alike) + 1})

    page.route(re.compile(r".*/api/jobs\?limit=.*"), listed)
    page.goto(finished.url)
    cells = page.locator(".job-row .cell-model")
    cells.nth(len(names)).wait_for()
    page.locator(".job-list").screenshot(path=str(ARTIFACTS / "job-list-names.png"))
    shown = []
    for n, name in enumerate(names):
        cell = cells.nth(n)
        assert name in (cell.get_attribute("title") or "")  # the whole name on hover
        assert cell.evaluate("(c) => c.scrollHeight <= c.clientHeight + 1"), cell.evaluate(
            "(c) => [c.scrollHeight, c.clientHeight, c.getBoundingClientRect().width, getComputedStyle(c).display]")
        shown.append(cell.text_content())
    assert shown[:3] == names[:3]  # on two lines, whole
    assert "…" in shown[3] and shown[3].endswith(", take 4") and shown[3].startswith("stop and resume")
    page.locator(".job-list").screenshot(path=str(ARTIFACTS / "job-list-names.png"))
    badge = page.locator('.job-row[data-job-id$="run"] .badge')
    assert badge.inner_text() == "evaluating base" and badge.get_attribute("data-status") == "loading_dataset"
    said = page.evaluate("""async () => (await import("/js/util.js")).jobActivity(
        {status: "stopping", phase: "evaluating_base"})""")
    assert said == "stopping"  # a step is said only while the job runs


# --- issue 42: an image job's rows, with their pictures (a fake worker writes the rows file: nothing trains) --------
@dataclass
class ImageJob:
    url: str
    job_id: str


@pytest.fixture(scope="module")
def image_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ImageJob]:
    home = tmp_path_factory.mktemp("image-rows-home")
    settings = Settings(home=home, dataset_roots=[DATA, home], sse_heartbeat_seconds=0.5)
    manager = JobManager(settings, worker_target=fake_workers.evaluates_images)
    cfg = job_config("org/vlm", home / "out", is_dataset_image=True, eval_steps=5)
    with running_server(settings, manager) as url, httpx.Client(base_url=url, timeout=30) as client:
        job_id = client.post("/api/jobs", json=cfg.public_dict()).json()["id"]
        wait_until(lambda: client.get(f"/api/jobs/{job_id}").json()["is_terminal"], 60, "the job's end")
        assert client.get(f"/api/jobs/{job_id}").json()["status"] == "completed"
        yield ImageJob(url, job_id)
    manager.close()


def test_an_image_rows_pictures_come_with_it_and_only_inline_ones(image_job: ImageJob) -> None:
    with httpx.Client(base_url=image_job.url, timeout=30) as client:
        got = client.get(f"/api/jobs/{image_job.job_id}/rows", params={"by": "exact_match", "order": "best"}).json()
    rows = sorted(got["rows"], key=lambda r: r["index"])
    assert [r["images"] for r in rows] == [
        [fake_workers.picture("red")], [fake_workers.picture("blue"), fake_workers.picture("white")],
        [fake_workers.picture("green")]]  # the link in row 1 is left out: the page shows inline pictures only
    assert got["loss"] == "" and all(r["loss"] is None for r in rows)


@pytest.mark.browser
def test_the_job_page_shows_each_rows_pictures_beside_its_answers(image_job: ImageJob, page: Page) -> None:
    page.goto(f"{image_job.url}/#/jobs/{image_job.job_id}")
    page.locator("#fold-rows summary").click()
    # no loss of their own: ordered by exact match, worst first, and no loss column
    page.locator("#rows-note").filter(has_text="3 of 3 rows, worst exact match first.").wait_for()
    assert page.locator("#rows-by").evaluate("(s) => [...s.options].map((o) => o.value)") == [
        "exact_match", "token_f1", "rouge_l"]
    assert page.locator("#rows-table").evaluate(HEADINGS) == [
        "row", "exact match", "prompt", "reference", "fine-tuned", "base model"]
    assert page.evaluate(STRAY_TEXT) == [] and page.evaluate(UNEVEN_TABLES) == []
    first = page.locator("#rows-table tbody tr").first
    assert first.get_attribute("data-index") == "0"  # the one the tuned model got wrong
    pictures = page.locator("#rows-table tbody tr .row-image")
    assert pictures.count() == 4
    assert pictures.evaluate_all("(imgs) => imgs.map((i) => i.src)") == [
        fake_workers.picture(c) for c in ("red", "blue", "white", "green")]
    page.wait_for_function("() => [...document.querySelectorAll('.row-image')].every((i) => i.complete && "
                           "i.naturalWidth === 96)")  # decoded: real pictures, 96 px wide
    assert pictures.first.get_attribute("alt") == "picture 1 of 1 of row shapes.jsonl:1"
    cells = first.locator("td")
    assert cells.nth(2).locator("img").count() == 1 and "What shape is this?" in cells.nth(2).inner_text()
    assert [cells.nth(n).inner_text() for n in (3, 4, 5)] == ["square", "circle", "square"]
    screenshot(page, "job-eval-rows-images.png")
