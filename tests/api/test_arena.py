"""The arena through its API: endpoint contenders on a scripted OpenAI-compatible server, blind votes, the
leaderboard, the votes as a dataset the report reads, and a real DPO job on them that raises its margin."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.chat import ChatHome
from tests.helpers.scripted_v1 import KEYS, SAY, Scripted
from tests.helpers.server import loopback_v1, running_server
from tests.helpers.wait import wait_until
from tunestudio.settings import Settings

pytestmark = pytest.mark.timeout(600)
KEY = "sk-arena-test-0123456789"
PROMPTS = ["The capital of France?", "Two plus two?", "The colour of the sky?", "The opposite of hot?"]


@pytest.fixture(scope="module")
def v1() -> Iterator[str]:
    with loopback_v1(Scripted) as url:
        yield url


@pytest.fixture(scope="module")
def server(chat_home: ChatHome) -> Iterator[str]:
    with running_server(Settings(home=chat_home.home)) as url:
        yield url


@pytest.fixture
def api(server: str, v1: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[httpx.Client]:
    monkeypatch.setenv("ARENA_TEST_KEY", KEY)
    with httpx.Client(base_url=server, timeout=60) as client:
        for name, says in (("good", "Paris."), ("bad", "Rome.")):
            added = client.post("/api/arena/endpoints", json={"name": name, "url": v1, "model": SAY + says,
                                                               "key_env": "ARENA_TEST_KEY"})
            assert added.status_code == 201, added.text
            assert added.json()["key_set"] is True
        yield client


def battle(api: httpx.Client, prompt: str, **fields: Any) -> dict[str, Any]:
    started = api.post("/api/arena/battles", json={"prompt": prompt, **fields})
    assert started.status_code == 202, started.text
    bid = started.json()["id"]
    return wait_until(lambda: b if (b := api.get(f"/api/arena/battles/{bid}").json())["status"] != "answering"
                      else None, 60, "the battle's answers")


def test_blind_votes_the_leaderboard_and_a_dpo_job_on_them(api: httpx.Client, chat_home: ChatHome,
                                                           tmp_path: Path) -> None:
    refused = api.post("/api/arena/battles", json={"prompt": "q", "models": ["endpoint:good"]})
    assert refused.status_code == 422 and "two different models" in refused.json()["detail"]["message"]
    assert api.put("/api/arena/models", json={"models": ["endpoint:good", "endpoint:bad"]}).status_code == 200

    for prompt in PROMPTS * 2:
        shown = battle(api, prompt)
        assert shown["status"] == "ready" and shown["models"] is None
        assert "good" not in str(shown) and "endpoint:" not in str(shown)
        good_side = "a" if shown["answers"]["a"] == "Paris." else "b"
        voted = api.post(f"/api/arena/battles/{shown['id']}/vote", json={"choice": good_side})
        assert voted.status_code == 200 and voted.json()["models"][good_side] == "endpoint:good"
        again = api.post(f"/api/arena/battles/{shown['id']}/vote", json={"choice": good_side})
        assert again.status_code == 409 and "has its vote already" in again.json()["detail"]["message"]
    assert KEYS[SAY + "Paris."] == f"Bearer {KEY}"  # the key went to the endpoint from the environment...
    for stored in chat_home.home.glob("arena.sqlite*"):
        assert KEY.encode() not in stored.read_bytes()  # ...and was never stored
    never = api.post("/api/arena/battles/bat-000000000000/vote", json={"choice": "a"})
    assert never.status_code == 404

    votes = api.get("/api/arena/votes").json()
    assert votes["total"] == 8 and all(v["vote"]["choice"] in "ab" for v in votes["votes"])
    board = api.get("/api/arena/leaderboard").json()
    assert [s["model"] for s in board["standings"]] == ["endpoint:good", "endpoint:bad"]
    assert board["standings"][0]["wins"] == 8 and board["standings"][0]["low"] > 1000
    assert board["pairs"][0]["win_rate"]["value"] == 0.0  # endpoint:bad, first by name, won none

    exported = api.post("/api/arena/exports", json={"format": "dpo"})
    assert exported.status_code == 201 and exported.json()["rows"] == 8
    report = api.post("/api/datasets/report", json={"local_datasets": [exported.json()["path"]], "method": "dpo"})
    assert report.status_code == 200, report.text
    assert report.json()["format"] == "preference" and report.json()["usable"] == 8 and not report.json()["refused"]

    trained = api.post("/api/arena/train", json={"from_job": chat_home.job.id, "method": "dpo", "max_steps": 8,
                                                 "learning_rate": 5e-3})
    assert trained.status_code == 201, trained.text
    job_id = trained.json()["job"]["id"]
    assert job_id in [r["model"] for r in api.get("/api/arena").json()["roster"]]  # it joins the arena
    done = wait_until(lambda: j if (j := api.get(f"/api/jobs/{job_id}").json())["status"] in (
        "completed", "failed", "interrupted") else None, 400, "the DPO job's end")
    assert done["status"] == "completed", done.get("error")
    margins = [p["extra"]["rewards/margins"] for p in api.get(f"/api/jobs/{job_id}/metrics").json()["records"]
               if "rewards/margins" in (p.get("extra") or {})]
    assert margins[0] == 0 and margins[-1] > 0.05, margins  # the policy starts as the reference


def test_a_prompt_file_path_with_a_nul_byte_is_a_422_not_a_server_error(api: httpx.Client) -> None:
    # schemathesis found it (tests/api/test_schema.py): the path was resolved before it was checked
    refused = api.post("/api/arena/battles", json={"prompts_file": "a\u0000b.jsonl", "models": []})
    assert refused.status_code == 422 and refused.json()["detail"]["field"] == "prompts_file"
