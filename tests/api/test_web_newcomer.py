"""The studio as a newcomer meets it (issue 32), in a real browser over one server whose roots leave out the repository.

One short chain of real tiny-model jobs (a dataset with a broken line, evaluation, sample prompts: stopped, resumed,
exported) serves every test that needs a real job; the rest use the form alone or a scripted worker.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page
from typer.testing import CliRunner

from tunestudio import settings as settings_module
from tunestudio.api.routes import web as web_routes
from tunestudio.jobs.manager import JobManager
from tunestudio.settings import BUNDLED_DATASETS, Settings
from tunestudio.worker import child
from tunestudio.worker.child import WorkerArgs

from ..helpers.jobs import DATA
from ..helpers.server import read_sse, running_server
from ..helpers.wait import wait_until
from . import test_web as web
from .test_web import SHORT, screenshot, wait_for_status
from .test_web_studio import AXE, axe_serious

playwright, browser, page = web.playwright, web.browser, web.page

pytestmark = pytest.mark.browser

NAME, NOTES = "garden words", "the broken line stays out"
BROKEN_LINE = 5  # the line of the chain's dataset that is not JSON


def scripted_or_real(args: WorkerArgs) -> None:
    """The real worker, except for models named scripted/...: those complete at once with empty answers."""
    if not str(args.public_config.get("model_name", "")).startswith("scripted/"):
        child.main(args)
        return
    child.become_worker(args)
    output = Path(args.public_config["output_dir"])
    output.mkdir(parents=True, exist_ok=True)
    (output / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    seq = 0

    def emit(kind: str, **fields: Any) -> None:
        nonlocal seq
        seq += 1
        args.events.put(json.dumps({"kind": kind, "seq": seq, "ts": time.time(), **fields}))

    emit("phase", phase="training")
    method = args.public_config.get("method")  # DPO and GRPO with their own metrics, as TRL names them
    for step, margin, accuracy in ((1, 0.5, 0.75), (2, 0.9, 1.0)):
        extra = {"rewards/margins": margin, "rewards/accuracies": accuracy} if method == "dpo" else {
            "reward": margin, "reward_std": margin / 2, "frac_reward_zero_std": accuracy,
            "rewards/exact_match/mean": margin} if method == "grpo" else None
        emit("progress", step=step, total_steps=2, loss=1.0 / step, extra=extra)
    emit("completed", output_dir=str(output), stopped=False, saved=True, global_step=2,
         samples=[{"prompt": "Say nothing.", "before": "", "after": "  "}])
    args.events.close()
    args.events.join_thread()
    sys.exit(0)


@dataclass
class Studio:
    url: str
    home: Path
    work: Path  # the one dataset root: neither the repository nor the tiny model's folder is under it


@pytest.fixture(scope="module")
def studio(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[Studio]:
    root = tmp_path_factory.mktemp("newcomer")
    work, models = root / "work", root / "models"
    work.mkdir()
    models.mkdir()
    for name in ("alpaca.jsonl", "preference.jsonl", "prompts.jsonl"):  # the scripted jobs' datasets, in the root
        (work / name).write_text((DATA / name).read_text())
    with pytest.MonkeyPatch.context() as patch:
        # The embedded model is the session's tiny model (the one `make` built, or one built for the tests).
        patch.setattr(settings_module, "EMBEDDED_MODEL", tiny_model)
        patch.setattr(web_routes, "EMBEDDED_MODEL", tiny_model)
        settings = Settings(home=root / "home", dataset_roots=[work], model_roots=[models],
                            sse_heartbeat_seconds=0.5, sse_retry_ms=500)
        manager = JobManager(settings, worker_target=scripted_or_real)
        with running_server(settings, manager) as url:
            yield Studio(url, settings.data_dir(), work)
        manager.close()


def client(studio: Studio) -> httpx.Client:
    return httpx.Client(base_url=studio.url, timeout=30)


def wait_job(studio: Studio, job_id: str, done: Any, timeout: float, what: str) -> dict[str, Any]:
    with client(studio) as c:
        return wait_until(lambda: (job := c.get(f"/api/jobs/{job_id}").json()) and done(job) and job, timeout, what,
                          every=0.2)


def cancel(studio: Studio, job_id: str) -> None:
    with client(studio) as c:
        c.post(f"/api/jobs/{job_id}/cancel", json={})
    wait_job(studio, job_id, lambda j: j["is_terminal"], 120, f"job {job_id} to end")


# --- the chain of real jobs ----------------------------------------------------------------------------------
@dataclass
class Chain:
    first: str  # stopped with a save
    resumed: str  # completed
    export: str  # a merged export of the resumed job
    phases: list[str]  # what the first job's page said it was doing (its badge, then its phase line), in order


PHASE_WATCH = """() => {
  window.__phases = [];
  const note = () => {
    const text = ['#job-status', '#job-phase'].map((s) => document.querySelector(s)?.textContent).join(' ').trim();
    if (text && window.__phases.at(-1) !== text) window.__phases.push(text);
  };
  new MutationObserver(note).observe(document.querySelector('#main'),
    {subtree: true, childList: true, characterData: true});
}"""


@pytest.fixture(scope="module")
def chain(studio: Studio, browser: Browser, tiny_model: Path) -> Chain:
    lines = (DATA / "alpaca.jsonl").read_text().splitlines()
    lines.insert(BROKEN_LINE - 1, '{"instruction": "a line cut short')
    data = studio.work / "garden.jsonl"
    data.write_text("\n".join(lines) + "\n")
    config = {"model_name": str(tiny_model), "local_datasets": [str(data)], **SHORT, "max_steps": 150,
              "eval_steps": 50, "eval_generate_rows": 4,
              "sample_prompts": ["Reverse the letters of the word.\n\ngarden"]}
    with client(studio) as c:
        created = c.post("/api/jobs", json=config)
        assert created.status_code == 201, created.text
        first = created.json()["id"]
        assert c.patch(f"/api/jobs/{first}", json={"name": NAME, "notes": NOTES}).status_code == 200
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        watcher = context.new_page()
        watcher.goto(f"{studio.url}/#/jobs/{first}")
        watcher.locator("#job-phase").wait_for(state="attached")
        watcher.evaluate(PHASE_WATCH)
        wait_job(studio, first, lambda j: (j["progress"] or {}).get("step", 0) >= 3, 600, "training steps")
        with client(studio) as c:
            assert c.post(f"/api/jobs/{first}/stop", json={"save": True}).status_code == 200
        wait_job(studio, first, lambda j: j["is_terminal"], 300, "the stop")
        phases = watcher.evaluate("() => window.__phases")
    finally:
        context.close()
    with client(studio) as c:
        resumed = c.post(f"/api/jobs/{first}/resume", json={}).json()["id"]
    job = wait_job(studio, resumed, lambda j: j["is_terminal"], 600, "the resumed job")
    assert job["status"] == "completed", job
    with client(studio) as c:
        export = c.post(f"/api/jobs/{resumed}/exports", json={"target": "merged"}).json()["id"]
    assert wait_job(studio, export, lambda j: j["is_terminal"], 600, "the export")["status"] == "completed"
    return Chain(first, resumed, export, phases)


def stream_events(studio: Studio, job_id: str) -> list[dict[str, Any]]:
    """A finished job's whole stream, as its event stream replays it."""
    with client(studio) as c, c.stream("GET", f"/api/jobs/{job_id}/events?after=0") as response:
        return [{"kind": e.event, **e.json()} for e in read_sse(response)]


# --- 1. the prefilled model and dataset, wherever the server runs ------------------------------------------
@pytest.mark.timeout(600)
def test_the_prefilled_model_and_dataset_are_usable_outside_the_repository(studio: Studio, tiny_model: Path,
                                                                         page: Page) -> None:
    refused: list[str] = []
    page.on("response", lambda r: refused.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    page.goto(studio.url)
    assert page.locator("#f-model_name").input_value() == str(tiny_model)
    assert page.locator("#f-local_datasets").input_value() == str(BUNDLED_DATASETS / "alpaca.jsonl")
    page.locator("#preview-format").filter(has_text="alpaca").wait_for(timeout=90_000)
    page.locator("#estimate-fit").filter(has_text="Fits").wait_for(timeout=60_000)
    assert refused == []  # a clean first load: no 4xx in the console

    # The form's job is evaluated (issue 38, finding 10), and says on which rows.
    assert float(page.locator("#f-eval_steps").input_value()) > 0
    assert "held-out 5% of the rows" in page.locator('.field[data-field="eval_steps"] .help').inner_text()
    # The report's duplicates are one click away from gone (finding 8): the bundled rows repeat a lot.
    page.locator("#report-run").click()
    usable = int(re.search(r"([\d,]+) usable", page.locator("#report-summary").inner_text(timeout=180_000))
                 .group(1).replace(",", ""))
    exact, near = (int(n.replace(",", "")) for n in re.search(r"([\d,]+) exact .*?([\d,]+) near",
                                                              page.locator("#report-duplicates").inner_text()).groups())
    assert exact > 0
    page.locator("#report-dedupe").click()
    mode = "near" if near else "exact"
    assert page.locator("#f-dedupe").input_value() == f'"{mode}"'
    left = usable - exact - (near if near else 0)
    assert f"{left:,} of {usable:,} rows are left" in page.locator("#report-dedupe-left").inner_text()

    # Name and notes on the form; Start takes the defaults and lands on the new job, focused, titled by its state.
    page.locator("#f-job-name").fill("first try")
    page.locator("#f-job-notes").fill("all defaults")
    page.locator("#f-max_steps").fill("2")
    page.locator("#start").click()
    page.wait_for_url("**/#/jobs/*")
    job_id = page.locator(".job-view").get_attribute("data-job-id")
    page.locator("#job-title").filter(has_text="first try").wait_for()
    page.wait_for_function("() => / · first try · tunestudio$/.test(document.title)", timeout=120_000)
    page.wait_for_function("() => document.activeElement.id === 'main'")  # the view, once it has loaded
    assert page.locator("#job-notes").input_value() == "all defaults"
    cancel(studio, job_id)
    with client(studio) as c:
        config = c.get(f"/api/jobs/{job_id}").json()["config"]
    assert config["dedupe"] == mode and config["eval_steps"] > 0 and config["eval_split"] is None
    with client(studio) as c:
        # Read, never written: the bundled folder takes no output.
        refused_output = c.post("/api/jobs", json={"model_name": str(tiny_model), "local_datasets": [
            str(BUNDLED_DATASETS / "alpaca.jsonl")], "output_dir": str(BUNDLED_DATASETS / "out")})
    assert refused_output.status_code == 422, refused_output.text
    assert refused == []


# --- 2. rows that training drops, named before and after ------------------------------------------------------
@pytest.mark.timeout(300)
def test_the_preview_names_bad_rows_and_an_upload_clears_the_stale_error(studio: Studio, tmp_path: Path,
                                                                         page: Page) -> None:
    page.goto(studio.url)
    page.locator("#new-job h1").wait_for()
    page.locator("#f-model_name").fill("org/model")  # a hub id: only the dataset is wrong
    page.locator("#f-local_datasets").fill(str(studio.work / "missing.jsonl"))
    page.locator("#start").click()
    page.locator('[data-error-for="local_datasets"]').filter(has_text="missing.jsonl").wait_for()

    rows = (DATA / "alpaca.jsonl").read_text().splitlines()[:9]
    rows.insert(4, '{"instruction": "a line cut short')
    upload = tmp_path / "données 東京.jsonl"
    upload.write_text("\n".join(rows) + "\n", encoding="utf-8")
    page.locator("#upload-input").set_input_files(str(upload))
    page.locator("#upload-status").filter(has_text="Stored as données_東京.jsonl").wait_for()  # letters kept
    assert page.locator('[data-error-for="local_datasets"]').inner_text() == ""  # the stale error is gone
    assert "invalid" not in (page.locator('.field[data-field="local_datasets"]').get_attribute("class") or "")
    problems = page.locator("#preview-problems")
    problems.wait_for(timeout=90_000)
    assert "1 of the 10 rows read will be dropped" in problems.inner_text()
    assert "row 5 is not valid JSON" in problems.inner_text()

    bad = tmp_path / "notes.txt"
    bad.write_text("not a dataset")
    page.locator("#upload-input").set_input_files(str(bad))
    page.locator("#upload-status.upload-error").filter(has_text="must be one of").wait_for()  # an error, in red
    screenshot(page, "newcomer-preview-problems.png")


# --- 3. clone keeps the method ------------------------------------------------------------------------------
@pytest.mark.timeout(300)
def test_clone_of_a_dpo_job_keeps_dpo_and_previews_its_rows(studio: Studio, page: Page) -> None:
    with client(studio) as c:
        created = c.post("/api/jobs", json={"model_name": "scripted/dpo", "method": "dpo", "beta": 0.2,
                                            "local_datasets": [str(studio.work / "preference.jsonl")]})
        assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    page.goto(f"{studio.url}/#/jobs/{job_id}")
    wait_for_status(page, "completed")
    page.locator("#config-card summary").click()
    page.locator("#clone").click()
    page.wait_for_url("**/#/new")
    page.locator('input[name="method"][value="dpo"]:checked').wait_for(state="attached")
    assert page.locator("#f-beta").is_visible() and page.locator("#f-beta").input_value() == "0.2"
    page.locator("#preview-format").filter(has_text="preference").wait_for(timeout=90_000)
    assert page.locator("#preview .error-text").count() == 0

    # Its chart: TRL's keys said as words, the accuracy (a share) on an axis of its own in %.
    page.goto(f"{studio.url}/#/jobs/{job_id}")
    legend = page.locator("#method-chart .u-legend")
    legend.filter(has_text="reward margin").wait_for()
    assert "accuracy (chosen > rejected)" in legend.inner_text() and "rewards/" not in legend.inner_text()
    assert page.locator("#method-chart .u-axis").count() == 3  # step, rewards, and the share in %


@pytest.mark.timeout(300)
def test_a_grpo_job_charts_its_reward_mean_spread_and_groups_without_spread(studio: Studio, page: Page) -> None:
    # Issue 38, finding 9: GRPO learns from the reward's spread within a group; the chart shows it.
    with client(studio) as c:
        created = c.post("/api/jobs", json={"model_name": "scripted/grpo", "method": "grpo",
                                            "reward_functions": ["exact_match"],
                                            "local_datasets": [str(studio.work / "prompts.jsonl")]})
        assert created.status_code == 201, created.text
    page.goto(f"{studio.url}/#/jobs/{created.json()['id']}")
    wait_for_status(page, "completed")
    chart = page.locator("#method-chart")
    page.wait_for_function("() => Number(document.querySelector('#method-chart').dataset.points) === 2")
    assert (chart.get_attribute("data-series") or "").split(",") == [
        "reward", "reward_std", "frac_reward_zero_std", "rewards/exact_match/mean"]
    legend = chart.locator(".u-legend").inner_text()
    assert "reward spread (std)" in legend and "groups with no spread" in legend
    assert chart.locator(".u-axis").count() == 3  # step, rewards, and the share of groups in %


# --- 4. numbers: a cleared or unreadable field is an error at the field -----------------------------------------
@pytest.mark.timeout(300)
def test_a_cleared_or_comma_number_is_an_error_at_its_field_on_the_first_submit(studio: Studio, page: Page) -> None:
    with client(studio) as c:
        before = c.get("/api/jobs").json()["total"]
    page.goto(studio.url)
    page.locator("#new-job h1").wait_for()
    page.locator("#f-local_datasets").fill(str(studio.work / "alpaca.jsonl"))
    page.locator("#preview-format").wait_for(timeout=90_000)
    page.locator("#f-learning_rate").fill("")
    page.locator("#f-lora_dropout").fill("0,003")
    page.locator("#start").click()  # once
    page.locator('[data-error-for="learning_rate"]').filter(has_text="give a value").wait_for(timeout=5_000)
    assert "commas are not read" in page.locator('[data-error-for="lora_dropout"]').inner_text()
    assert page.evaluate("() => document.activeElement.id") == "f-learning_rate"
    page.locator("#f-learning_rate").fill("0.003")
    page.locator("#f-lora_dropout").fill("1e")
    page.locator("#start").click()
    page.locator('[data-error-for="lora_dropout"]').filter(has_text="not a number").wait_for(timeout=5_000)
    assert page.locator('[data-error-for="learning_rate"]').inner_text() == ""
    with client(studio) as c:
        assert c.get("/api/jobs").json()["total"] == before  # nothing was sent


# --- 8. a preference file with SFT chosen -------------------------------------------------------------------------
@pytest.mark.timeout(300)
def test_a_preference_file_with_sft_says_to_choose_dpo_orpo_or_kto(studio: Studio, page: Page) -> None:
    page.goto(studio.url)
    page.locator("#new-job h1").wait_for()
    page.locator("#f-local_datasets").fill(str(studio.work / "preference.jsonl"))
    hint = page.locator("#preview .error-text").filter(has_text="choose one of those as the training method")
    hint.wait_for(timeout=90_000)
    # every method that trains on pairs is named (the reward model's too, issue 44)
    assert "DPO, ORPO, KTO and Reward model" in hint.inner_text() and "method: dpo, orpo, kto or reward" in \
        hint.inner_text()


@pytest.mark.timeout(300)
def test_an_empty_answer_says_empty(studio: Studio, page: Page) -> None:
    with client(studio) as c:
        job_id = c.post("/api/jobs", json={"model_name": "scripted/empty", "sample_prompts": ["Say nothing."],
                                           "local_datasets": [str(studio.work / "alpaca.jsonl")]}).json()["id"]
    page.goto(f"{studio.url}/#/jobs/{job_id}")
    wait_for_status(page, "completed")
    row = page.locator("#samples tbody tr").first
    row.wait_for()
    assert [cell.inner_text() for cell in row.locator("td").all()][1:] == ["(empty)", "(empty)"]


# --- the chain: 2 (warnings), 5 (resume), 6 (events), 7 (phases), the export's page ---------------------------
@pytest.mark.timeout(1500)
def test_the_steps_around_training_are_named_with_their_progress(studio: Studio, chain: Chain) -> None:
    said = " | ".join(chain.phases)
    # the badge names the step (its status is still loading_dataset: issue 38, finding 12), the line its progress
    assert re.search(r"generating base \d+ / \d+", said), said  # the sample prompts, the held-out rows
    assert re.search(r"evaluating base \d+ / \d+", said), said  # the eval loss at step 0
    assert not re.search(r"loading dataset \d", said), said
    steps = [e for e in stream_events(studio, chain.first) if e["kind"] == "phase" and e.get("total")]
    evaluating = [e for e in steps if e["phase"] == "evaluating_base"]
    assert evaluating[-1]["done"] == evaluating[-1]["total"] > 0
    after = {e["phase"] for e in stream_events(studio, chain.resumed) if e["kind"] == "phase"}
    assert "generating" in after  # the result's samples and answers


@pytest.mark.timeout(1500)
def test_a_jobs_warnings_are_a_banner_on_its_page_and_in_jobs_show(studio: Studio, chain: Chain, page: Page,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    page.goto(f"{studio.url}/#/jobs/{chain.first}")
    wait_for_status(page, "stopped")
    banner = page.locator("#job-warnings")
    banner.filter(has_text=f"row {BROKEN_LINE}").wait_for()
    assert "dropped 1 of 401 rows" in banner.inner_text()
    screenshot(page, "newcomer-job-warnings.png")

    from tunestudio import cli

    monkeypatch.setenv("TUNESTUDIO_HOME", str(studio.home))
    shown = CliRunner().invoke(cli.app, ["jobs", "show", chain.first])
    assert shown.exit_code == 0, shown.output
    said = " ".join(shown.output.split())  # rich wraps long lines
    assert re.search(rf"warning dataset .*dropped 1 of 401 rows.* row {BROKEN_LINE} ", said), said


@pytest.mark.timeout(1500)
def test_a_finished_jobs_events_are_listed(studio: Studio, chain: Chain, page: Page) -> None:
    page.goto(f"{studio.url}/#/jobs/{chain.resumed}")
    wait_for_status(page, "completed")
    page.locator("#events-log .log-line").first.wait_for(state="attached")
    lines = page.locator("#events-log .log-line").all_text_contents()  # in the closed Events section
    assert any("trainable" in line for line in lines), lines  # the worker's log events
    assert any("dropped 1 of 401 rows" in line for line in lines), lines
    assert lines[-1] == "training finished"


@pytest.mark.timeout(1500)
def test_a_resumed_job_keeps_its_name_notes_and_base_eval_loss(studio: Studio, chain: Chain, page: Page) -> None:
    page.goto(f"{studio.url}/#/jobs/{chain.resumed}")
    wait_for_status(page, "completed")
    page.locator("#job-title").filter(has_text=NAME).wait_for()
    assert page.locator("#job-notes").input_value() == NOTES
    base = page.locator('#evaluation tr[data-metric="eval_loss"] td').nth(1)
    base.wait_for()
    assert re.fullmatch(r"\d+(\.\d+)?", base.inner_text()), base.inner_text()
    with client(studio) as c:
        first = c.get(f"/api/jobs/{chain.first}/metrics").json()["records"]
        resumed = c.get(f"/api/jobs/{chain.resumed}").json()
    measured = next(r["eval_loss"] for r in first if r["step"] == 0 and r["eval_loss"] is not None)
    assert resumed["evaluation"]["metrics"]["eval_loss"]["before"] == measured  # the parent's, not a new one
    assert resumed["evaluation"]["metrics"]["perplexity"]["before"] is not None
    assert axe_serious(page) == []  # the "resumed from" link stands out from its text


@pytest.mark.timeout(1500)
def test_an_export_page_has_no_training_tiles_or_chat(studio: Studio, chain: Chain, page: Page) -> None:
    page.goto(f"{studio.url}/#/jobs/{chain.export}")
    wait_for_status(page, "completed")
    assert page.locator("#stat-loss").count() == 0 and page.locator("#stat-lr").count() == 0
    assert page.locator("#stat-elapsed").inner_text() != "–"
    assert page.locator("#chat-slot").inner_text() == ""
    page.locator("#events-log .log-line").filter(has_text="export finished").wait_for(state="attached")
    screenshot(page, "newcomer-export-page.png")


# --- 8. small things: a delete refusal in its own place, compare by name, labels ----------------------------------
def scripted_job(studio: Studio, name: str | None = None, **config: Any) -> str:
    with client(studio) as c:
        created = c.post("/api/jobs", json={"model_name": "scripted/job", "local_datasets": [
            str(studio.work / "alpaca.jsonl")], **config})
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
        if name:
            c.patch(f"/api/jobs/{job_id}", json={"name": name})
    wait_job(studio, job_id, lambda j: j["is_terminal"], 120, f"job {job_id}")
    return job_id


@pytest.mark.timeout(300)
def test_a_refused_delete_is_said_under_its_button(studio: Studio, page: Page) -> None:
    job_id = scripted_job(studio)
    refusal = {"detail": {"code": "conflict", "message": f"job X refers to job {job_id}; delete it first"}}
    page.route(re.compile(r".*/api/jobs/[^/?]+\?delete_artifacts=.*"),
               lambda route: route.fulfill(status=409, json=refusal))
    page.goto(f"{studio.url}/#/jobs/{job_id}")
    wait_for_status(page, "completed")
    page.locator("#delete").click()
    page.locator("#confirm-yes").click()
    page.locator("#delete-error").filter(has_text="delete it first").wait_for()
    assert page.locator("#job-saved").inner_text() == ""  # not squeezed in beside the name


@pytest.mark.timeout(300)
def test_compare_names_jobs_by_their_names_and_method_options_read_as_words(studio: Studio, page: Page) -> None:
    first, second = scripted_job(studio, "lr 1e-3"), scripted_job(studio, "lr 3e-3", learning_rate=0.003)
    page.goto(f"{studio.url}/#/compare/{first},{second}")
    legend = page.locator(".compare-legend")
    legend.filter(has_text="lr 3e-3").wait_for()
    assert "lr 1e-3" in legend.inner_text() and first not in legend.inner_text()

    page.goto(studio.url)
    page.locator('input[name="method"][value="dpo"]').locator("xpath=..").click()
    assert page.locator('label[for="f-dpo_loss_type"]').inner_text() == "DPO loss"
    assert page.locator("h2", has_text="Weights to train").count() == 1


@pytest.mark.timeout(300)
def test_a_phone_wide_screen_never_scrolls_sideways_and_new_job_starts_at_the_form(studio: Studio,
                                                                                   page: Page) -> None:
    first, second = scripted_job(studio, "a job with a rather long name"), scripted_job(studio, learning_rate=0.003)
    page.set_viewport_size({"width": 390, "height": 844})
    wide = "() => document.scrollingElement.scrollWidth"
    page.goto(studio.url)
    page.locator("#new-job h1").wait_for()
    page.locator("#estimate-fit").wait_for()
    assert page.evaluate(wide) <= 390
    page.goto(f"{studio.url}/#/jobs/{first}")
    wait_for_status(page, "completed")
    page.locator("#config-card summary").click()
    assert page.evaluate(wide) <= 390
    page.goto(f"{studio.url}/#/compare/{first},{second}")
    page.locator("#config-diff").wait_for()
    assert page.evaluate(wide) <= 390
    page.evaluate("() => window.scrollTo(0, document.body.scrollHeight)")
    page.locator("#nav-new").click()
    page.locator("#new-job h1").wait_for()
    page.wait_for_function("() => Math.abs(document.querySelector('#main').getBoundingClientRect().top) < 100")


def axe_rule(page: Page, rule: str) -> list[str]:
    """What axe-core's one rule finds on the page, whatever its impact (heading-order is "moderate")."""
    page.add_script_tag(path=str(AXE))
    return page.evaluate(f"""async () => (await axe.run(document, {{runOnly: ['{rule}']}})).violations
        .map((v) => v.nodes.map((n) => n.target.join(' ')).join(', '))""")


@pytest.mark.timeout(300)
def test_headings_go_in_order_on_the_job_and_compare_views(studio: Studio, page: Page) -> None:
    first, second = scripted_job(studio, sample_prompts=["Say nothing."]), scripted_job(studio)
    page.goto(f"{studio.url}/#/jobs/{first}")
    wait_for_status(page, "completed")
    page.locator("#samples").wait_for()
    assert axe_rule(page, "heading-order") == []
    page.goto(f"{studio.url}/#/compare/{first},{second}")
    page.locator("#config-diff").wait_for()
    assert axe_rule(page, "heading-order") == []


@pytest.mark.timeout(300)
def test_the_upload_button_shows_keyboard_focus(studio: Studio, page: Page) -> None:
    page.goto(studio.url)
    page.locator("#new-job h1").wait_for()
    page.locator("#f-local_datasets").focus()
    page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.id") == "upload-input"
    outline = page.evaluate("() => getComputedStyle(document.querySelector('label[for=upload-input]')).outlineStyle")
    assert outline == "solid"
