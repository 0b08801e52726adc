"""POST /api/judgements/{id}/cancel: a running judgement, its judge trickling a reply with a long deadline left, ends
as cancelled at once (its thread gone), a second cancel answers 409 and an unknown id 404. The app's judgements
answer from a stand-in (no model is trained); the judge is a scripted endpoint on loopback."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.helpers.scripted_v1 import SEEN, Scripted
from tests.helpers.server import loopback_v1
from tests.helpers.wait import wait_until
from tunestudio.api import create_app
from tunestudio.jobs.manager import JobManager
from tunestudio.judge import Endpoint, Judgements
from tunestudio.judge.core import Answerer, Messages
from tunestudio.judge.service import FOLDER
from tunestudio.settings import Settings

BASE = "http://127.0.0.1:8765"


def answers(model_id: str, max_tokens: int, cancel: threading.Event) -> Answerer:
    def answer(messages: Messages) -> str:
        return f"{model_id} says moo"

    return answer


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(home=tmp_path / "home", prewarm=False)
    manager = JobManager(settings)
    with TestClient(create_app(settings, manager), base_url=BASE, headers={"Origin": BASE}) as client:
        client.app.state.judgements.close()  # type: ignore[attr-defined]
        client.app.state.judgements = Judgements(settings.data_dir() / FOLDER, answers)  # type: ignore[attr-defined]
        yield client
    manager.close()


def test_a_running_judgement_is_cancelled_over_http_and_a_second_cancel_is_409(client: TestClient) -> None:
    judgements: Judgements = client.app.state.judgements  # type: ignore[attr-defined]
    with loopback_v1(Scripted) as url:
        judge = Endpoint(url, "trickle", deadline_s=600)
        before = len(SEEN["trickle"])
        started = judgements.start("job", "job", "job:base", ["cow?", "pig?"], judge.cancellable, judge.describe(),
                                   "test")
        jid = started["id"]
        wait_until(lambda: len(SEEN["trickle"]) > before, 30, "the judge's call to be under way")
        assert client.get(f"/api/judgements/{jid}").json()["status"] == "running"

        cancelled = client.post(f"/api/judgements/{jid}/cancel", json={})
        assert cancelled.status_code == 200, cancelled.text
        assert cancelled.json()["status"] == "cancelled" and cancelled.json()["rows"] == []
        assert client.get(f"/api/judgements/{jid}").json()["status"] == "cancelled"
        assert not any(t.name == f"judge-{jid}" for t in threading.enumerate())  # its thread has ended

        again = client.post(f"/api/judgements/{jid}/cancel", json={})
        assert again.status_code == 409 and "is cancelled" in again.json()["detail"]["message"]
        assert client.post("/api/judgements/jdg-000000000000/cancel", json={}).status_code == 404
