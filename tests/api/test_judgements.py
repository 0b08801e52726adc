"""A pairwise judge through the API and the page, where the judge is another job on this very server (its /v1)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser

from tests.helpers.browser import browser, open_page, playwright, screenshot  # noqa: F401  (module fixtures)
from tests.helpers.chat import ChatHome
from tests.helpers.jobs import DATA, job_config
from tests.helpers.scripted_v1 import Scripted
from tests.helpers.server import loopback_v1, running_server
from tests.helpers.wait import wait_until
from tunestudio.jobs.manager import JobManager
from tunestudio.jobs.models import Job
from tunestudio.jobs.status import JobStatus
from tunestudio.judge.core import judge_messages
from tunestudio.settings import Settings

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]
VERDICT = "1"  # a judge may answer with just the verdict; JSON with a reason is read too (tests/judge)


def _judge_rows(path: Path, count: int = 64) -> Path:
    """Judge conversations that always prefer Answer 1: a judge with a position bias and nothing else."""
    rows = [json.loads(line) for line in (DATA / "alpaca.jsonl").read_text().splitlines() if line.strip()]
    rng = random.Random(3)
    with path.open("w") as fh:
        for _ in range(count):
            q, a, b = (rng.choice(rows) for _ in range(3))
            messages = judge_messages(q["instruction"][:40], a["output"][:16], b["output"][:16])
            fh.write(json.dumps({"messages": [*messages, {"role": "assistant", "content": VERDICT}]}) + "\n")
    return path


@pytest.fixture(scope="module")
def served(chat_home: ChatHome, tiny_model: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Job, Job]]:
    data = _judge_rows(tmp_path_factory.mktemp("judge-data") / "judge.jsonl")
    settings = Settings(home=chat_home.home)
    with JobManager(settings) as manager:
        judge = manager.submit(job_config(tiny_model, chat_home.home / "judge-job", local_datasets=[str(data)],
                                          max_steps=40, max_seq_length=384, batch_size=8,
                                          train_on_completions=True))
        judge = wait_until(lambda: j if (j := manager.get(judge.id)).status.is_terminal else None, 600,
                           "the judge job's end")
    assert judge.status is JobStatus.completed, judge.error
    with running_server(settings) as base:
        yield base, chat_home.job, judge


@pytest.fixture
def judged_by_job(served: tuple[str, Job, Job], monkeypatch: pytest.MonkeyPatch) -> tuple[str, Job, Job]:
    base, _, judge = served
    monkeypatch.setenv("TUNESTUDIO_JUDGE_URL", f"{base}/v1")
    monkeypatch.setenv("TUNESTUDIO_JUDGE_MODEL", judge.id)
    return served


def test_a_job_judged_by_another_job_on_this_server(judged_by_job: tuple[str, Job, Job]) -> None:
    base, job, judge = judged_by_job
    with httpx.Client(base_url=base, timeout=60) as client:
        started = client.post(f"/api/jobs/{job.id}/judgements", json={"limit": 3, "max_tokens": 16})
        assert started.status_code == 202, started.text
        jid = started.json()["id"]
        assert started.json()["judge"] == {"url": f"{base}/v1", "model": judge.id}
        done = wait_until(lambda: r if (r := client.get(f"/api/judgements/{jid}").json())["status"] != "running"
                          else None, 600, "the judgement's end")
        listed = client.get(f"/api/jobs/{job.id}/judgements").json()
    assert done["status"] == "completed", done
    assert done["against"] == f"{job.id}:base" and done["source"] == "the job's held-out rows"
    summary = done["summary"]
    assert summary["rows"] == 3 == len(done["rows"])
    for row in done["rows"]:
        assert row["answer"] is not None and row["other"] is not None
        assert row["first"]["raw"] and row["second"]["raw"]  # both orders asked and answered
        if row["outcome"] == "error":
            assert row["error"]  # an unparseable verdict says so; it is never a tie
    assert summary["judged"] >= 1 and summary["judged"] + summary["errors"] == 3
    # a judge that always says "1" prefers a position, never an answer: every judged row is a tie by disagreement
    assert summary["ties"] == summary["disagreements"] == summary["judged"]
    assert summary["tie_rate"]["value"] == 1.0
    assert 0 < summary["score"]["low"] < 0.5 < summary["score"]["high"] <= 1
    assert [j["id"] for j in listed] == [jid] and "rows" not in listed[0]


def test_more_held_out_rows_than_the_five_shown_are_judged_each_as_it_was_held_out(
        judged_by_job: tuple[str, Job, Job]) -> None:
    base, job, _ = judged_by_job
    rows = json.loads(Path(job.result["evaluation"]["rows_file"]).read_text())["rows"]
    shown = job.result["evaluation"]["examples"]
    limit = len(shown) + 2
    assert len(rows) >= limit
    with httpx.Client(base_url=base, timeout=60) as client:
        started = client.post(f"/api/jobs/{job.id}/judgements", json={"limit": limit, "max_tokens": 4})
        assert started.status_code == 202, started.text
        assert started.json()["prompts"] == limit
        jid = started.json()["id"]
        done = wait_until(lambda: r if (r := client.get(f"/api/judgements/{jid}").json())["status"] != "running"
                          else None, 600, "the judgement's end")
    assert done["status"] == "completed", done
    assert len(done["rows"]) == limit
    for judged, held in zip(done["rows"], rows, strict=False):
        assert judged["prompt"] == held["prompt"]
        assert judged["messages"] == held["messages"] and judged["messages"][-1]["role"] == "user"


def test_what_cannot_be_judged_is_refused_with_the_field(served: tuple[str, Job, Job], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    base, job, judge = served
    monkeypatch.delenv("TUNESTUDIO_JUDGE_URL", raising=False)
    monkeypatch.delenv("TUNESTUDIO_JUDGE_MODEL", raising=False)
    with httpx.Client(base_url=base, timeout=60) as client:
        def post(job_id: str, **body: object) -> httpx.Response:
            return client.post(f"/api/jobs/{job_id}/judgements", json=body)

        no_judge = post(job.id)
        assert no_judge.status_code == 422 and "TUNESTUDIO_JUDGE_URL" in no_judge.json()["detail"]["message"]
        assert post("nope").status_code == 404
        assert post(job.id, against=job.id).json()["detail"]["field"] == "against"
        assert post(job.id, against="nope").json()["detail"]["field"] == "against"
        # the judge job evaluated nothing: no held-out rows to judge on
        no_rows = post(judge.id)
        assert no_rows.status_code == 409 and "prompts" in no_rows.json()["detail"]["message"]
        outside = post(job.id, prompts_file="/etc/hostname")
        assert outside.status_code == 422 and outside.json()["detail"]["field"] == "prompts_file"
        assert post(job.id, prompts=[]).status_code == 422
        assert client.get("/api/judgements/jdg-000000000000").status_code == 404


def test_the_page_starts_a_judgement_and_shows_every_row(judged_by_job: tuple[str, Job, Job],
                                                        browser: Browser) -> None:  # noqa: F811
    base, job, _ = judged_by_job
    with open_page(browser, timeout_ms=300_000) as page:
        page.goto(f"{base}/#/jobs/{job.id}")
        page.locator("#judge-panel").wait_for()
        page.locator("#judge-limit").fill("2")
        # an earlier test's judgement of this job is open already: wait for the one this click starts, by its id
        with page.expect_response(lambda r: r.url.endswith(f"/api/jobs/{job.id}/judgements")
                                  and r.request.method == "POST") as posted:
            page.locator("#judge-start").click()
        jid = posted.value.json()["id"]
        summary = page.locator(f"#judge-summary-{jid}")
        summary.filter(has_text="completed").wait_for()
        rows = page.locator("#judge-rows tbody tr")
        assert rows.count() == 2
        for i in range(2):
            outcome = rows.nth(i).get_attribute("data-outcome")
            assert outcome in ("tie", "error")  # a judge that always says "1" never prefers an answer
            cells = rows.nth(i).locator("td").all_inner_texts()
            assert cells[1] and cells[4] and cells[5]  # the prompt, and a verdict (or its error) in both orders
        assert "95% interval" in summary.inner_text()
        screenshot(page, "judge-panel.png")


def test_the_page_cancels_a_running_judgement(chat_home: ChatHome, browser: Browser,  # noqa: F811
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The judge trickles its reply (a 600 s deadline): the panel's Cancel ends the judgement as cancelled."""
    job = chat_home.job
    with loopback_v1(Scripted) as url, running_server(Settings(home=chat_home.home)) as base, \
            open_page(browser, timeout_ms=300_000) as page:
        for name, value in (("URL", url), ("MODEL", "trickle"), ("DEADLINE_S", "600")):
            monkeypatch.setenv(f"TUNESTUDIO_JUDGE_{name}", value)
        page.goto(f"{base}/#/jobs/{job.id}")
        page.locator("#judge-limit").fill("2")
        with page.expect_response(lambda r: r.url.endswith(f"/api/jobs/{job.id}/judgements")
                                  and r.request.method == "POST") as posted:
            page.locator("#judge-start").click()
        jid = posted.value.json()["id"]
        page.locator(f"#judge-summary-{jid}").filter(has_text="running").wait_for()
        page.locator("#judge-cancel").click()
        page.locator(f"#judge-summary-{jid}").filter(has_text="cancelled").wait_for()
        assert page.locator("#judge-cancel").count() == 0  # only a running judgement has the button
        assert httpx.get(f"{base}/api/judgements/{jid}", timeout=30).json()["status"] == "cancelled"
