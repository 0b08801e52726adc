"""/api/data/make and /api/data/preview (issue 43) through the app, a real worker and the scripted teacher of
tests/helpers/teacher.py: a recipe runs as a job listed with its progress, the key read from the server's
environment and never accepted nor returned, refusals as 422s naming the field, a preview made in a child."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tunestudio.api import create_app
from tunestudio.settings import Settings
from tunestudio.worker.tiny_docs import write_docs

from ..helpers import teacher as scripted
from ..helpers.server import loopback_v1
from ..helpers.wait import wait_until

KEY = "sk-made-up-0123456789"


@pytest.fixture(scope="module")
def teacher() -> Iterator[str]:
    with loopback_v1(scripted.Teacher) as url:
        yield url


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(home=tmp_path / "home", dataset_roots=[tmp_path])
    with TestClient(create_app(settings), base_url="http://127.0.0.1:8765") as client:
        yield client


def recipe(tmp_path: Path, url: str, **fields: Any) -> dict[str, Any]:
    docs = write_docs(tmp_path / "docs")
    return {"sources": [str(docs["md"]), str(docs["pdf"])], "task": "qa", "rows": 3, "chunk_size": 300,
            "chunk_overlap": 50, "output": str(tmp_path / "data" / "qa.jsonl"),
            "teacher": {"base_url": url, "model": "good"}, **fields}


def test_a_recipe_runs_as_a_job_listed_with_its_progress_and_the_key_never_shown(
        client: TestClient, teacher: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEACHER_KEY", KEY)
    body = recipe(tmp_path, teacher, teacher={"base_url": teacher, "model": "good", "api_key_env": "TEACHER_KEY"})
    made = client.post("/api/data/make", json=body)
    assert made.status_code == 201, made.text
    job_id = made.json()["id"]
    done = wait_until(lambda: (j := client.get(f"/api/jobs/{job_id}").json())["is_terminal"] and j, 120,
                      "the make_data job to end")
    assert done["status"] == "completed", done["error"]
    assert done["kind"] == "make_data" and done["progress"]["step"] == 3 and done["progress"]["total_steps"] == 3
    rows = [json.loads(line) for line in (tmp_path / "data" / "qa.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(r["provenance"]["file"] for r in rows)
    listed = client.get("/api/jobs").json()["items"]
    assert [j["id"] for j in listed if j["kind"] == "make_data"] == [job_id]
    assert KEY in scripted.KEYS  # the server read the key from its environment and the worker sent it
    shown = made.text + json.dumps(listed) + client.get(f"/api/jobs/{job_id}/events?follow=false").text
    assert KEY not in shown and "api_key_env" in made.text


def test_refusals_are_422s_naming_the_field(client: TestClient, teacher: str, tmp_path: Path) -> None:
    def refused(body: dict[str, Any], path: str = "/api/data/make") -> tuple[str, str]:
        answer = client.post(path, json=body)
        assert answer.status_code == 422, answer.text
        detail = answer.json()["detail"]
        return detail["errors"][0]["field"], detail["message"]

    assert refused({**recipe(tmp_path, teacher), "api_key": KEY})[0] == "api_key"  # never taken in a request
    assert refused(recipe(tmp_path, teacher, task="tools"))[0] == "tools"
    assert refused(recipe(tmp_path, teacher, task="tooling"))[0] == "task"
    assert refused(recipe(tmp_path, teacher, sources=["/etc/hostname"]))[0] == "sources"
    field, message = refused(recipe(tmp_path, teacher, teacher={"base_url": teacher, "model": "good",
                                                                "api_key_env": "NOT_SET_HERE"}))
    assert field == "teacher.api_key_env" and "NOT_SET_HERE is not set" in message
    theirs = tmp_path / "mine.jsonl"
    theirs.write_text("{}\n")
    assert refused(recipe(tmp_path, teacher, output=str(theirs)))[0] == "output"
    assert theirs.read_text() == "{}\n"
    field, _ = refused({"recipe": recipe(tmp_path, teacher, chunk_overlap=400)}, "/api/data/preview")
    assert field == "recipe"


def test_a_preview_shows_rows_and_the_gates_verdicts_made_in_a_child_writing_nothing(
        client: TestClient, teacher: str, tmp_path: Path) -> None:
    pypdf_before = "pypdf" in sys.modules
    answer = client.post("/api/data/preview", json={"recipe": recipe(tmp_path, teacher), "rows": 2})
    assert answer.status_code == 200, answer.text
    rows = answer.json()["rows"]
    assert len(rows) == 2 and [t["role"] for t in rows[0]["messages"]] == ["user", "assistant"]
    assert rows[0]["provenance"]["key"] and answer.json()["removed"] == []
    short = client.post("/api/data/preview", json={
        "recipe": recipe(tmp_path, teacher, teacher={"base_url": teacher, "model": "short"}), "rows": 2}).json()
    assert short["rows"] == [] and {r["removed_by"] for r in short["removed"]} == {"answer_length"}
    assert not (tmp_path / "data").exists()
    assert ("pypdf" in sys.modules) == pypdf_before  # the PDF was read in the child
