"""Uploads at their limits: a full disk (507, nothing left behind), the uploads folder's total quota (413), a chunked
body over the per-file limit (413, was 400), and a second `file` part (refused, was silently dropped)."""

from __future__ import annotations

import errno
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tunestudio.api import create_app
from tunestudio.jobs.manager import JobManager
from tunestudio.settings import Settings

from ..helpers import fake_workers
from ..helpers.jobs import DATA

BASE = "http://127.0.0.1:8765"
ROW = (json.dumps({"instruction": "say hi", "output": "hi"}) + "\n").encode()  # 42 bytes


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path / "home", dataset_roots=[DATA], model_roots=[tmp_path], prewarm=False,
                    max_upload_bytes=4096, max_uploads_total_bytes=5000)


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    manager = JobManager(settings, worker_target=fake_workers.instant)
    with TestClient(create_app(settings, manager), base_url=BASE, headers={"Origin": BASE}) as client:
        yield client
    manager.close()


def _left(settings: Settings) -> list[str]:
    return sorted(p.name for p in settings.uploads_dir().iterdir())


def test_a_full_disk_is_a_507_and_leaves_no_partial_file(client: TestClient, settings: Settings,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    def disk_fills(source: Any, target: Any, length: int = 0) -> None:
        target.write(source.read(10))  # part of the file got written before the disk filled
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shutil, "copyfileobj", disk_fills)
    answer = client.post("/api/uploads", files={"file": ("rows.jsonl", ROW * 10)})
    assert answer.status_code == 507, answer.text
    detail = answer.json()["detail"]
    assert detail["code"] == "insufficient_storage" and "full" in detail["message"]
    assert "Traceback" not in answer.text
    assert _left(settings) == []  # neither the partial temporary file nor a final one
    monkeypatch.undo()
    assert client.post("/api/uploads", files={"file": ("rows.jsonl", ROW * 10)}).status_code == 201


def test_the_uploads_folder_has_a_total_quota(client: TestClient, settings: Settings) -> None:
    assert len(ROW) == 42
    first = client.post("/api/uploads", files={"file": ("a.jsonl", ROW * 60)})  # 2520 bytes
    assert first.status_code == 201, first.text
    listed = client.get("/api/uploads").json()
    assert (listed["total_bytes"], listed["max_total_bytes"]) == (2520, 5000)
    over = client.post("/api/uploads", files={"file": ("b.jsonl", ROW * 60)})  # 2520 more: 5040 > 5000
    assert over.status_code == 413, over.text
    assert "TUNESTUDIO_MAX_UPLOADS_TOTAL_BYTES" in over.json()["detail"]["message"]
    assert _left(settings) == ["a.jsonl"]
    assert client.post("/api/uploads", files={"file": ("c.jsonl", ROW * 40)}).status_code == 201  # 4200: fits
    assert client.request("DELETE", "/api/uploads/a.jsonl", json={}).status_code == 204
    assert client.post("/api/uploads", files={"file": ("b.jsonl", ROW * 60)}).status_code == 201  # room again


def _multipart(parts: list[tuple[str, str, bytes]], boundary: str = "tsboundary") -> bytes:
    body = b""
    for field, filename, data in parts:
        body += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{field}\"; filename=\"{filename}\"\r\n"
                 "Content-Type: application/octet-stream\r\n\r\n").encode() + data + b"\r\n"
    return body + f"--{boundary}--\r\n".encode()


def test_a_chunked_body_over_the_limit_is_a_413(client: TestClient, settings: Settings) -> None:
    body = _multipart([("file", "big.jsonl", ROW * 200)])  # 7800 bytes > max_upload_bytes 4096

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is found while reading
        for at in range(0, len(body), 1000):
            yield body[at:at + 1000]

    answer = client.post("/api/uploads", content=chunks(),
                         headers={"Content-Type": "multipart/form-data; boundary=tsboundary"})
    assert answer.status_code == 413, answer.text
    assert answer.json()["detail"]["code"] == "too_large"
    assert _left(settings) == []


def test_a_second_file_part_is_refused(client: TestClient, settings: Settings) -> None:
    body = _multipart([("file", "one.jsonl", ROW), ("file", "two.jsonl", ROW * 2)])
    answer = client.post("/api/uploads", content=body,
                         headers={"Content-Type": "multipart/form-data; boundary=tsboundary"})
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"]["field"] == "file" and "one file" in answer.json()["detail"]["message"]
    assert _left(settings) == []
