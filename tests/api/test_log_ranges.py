"""A job log's HTTP Range answers follow RFC 9110: suffix ranges, 416 with `Content-Range: bytes */SIZE` for a
range the log cannot satisfy, never a 500 for absurd numbers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from tunestudio.api import create_app
from tunestudio.jobs.manager import JobManager
from tunestudio.settings import Settings

from ..helpers import fake_workers
from ..helpers.jobs import DATA
from ..helpers.wait import wait_until

BASE = "http://127.0.0.1:8765"
TEXT = "line one\nnaïve € line\nlast line\n"
SIZE = len(TEXT.encode())


@pytest.fixture
def job_log(tmp_path: Path) -> Iterator[tuple[TestClient, str, Path]]:
    settings = Settings(home=tmp_path / "home", dataset_roots=[DATA], model_roots=[tmp_path], prewarm=False)
    manager = JobManager(settings, worker_target=fake_workers.instant)
    with TestClient(create_app(settings, manager), base_url=BASE, headers={"Origin": BASE}) as client:
        created = client.post("/api/jobs", json={"model_name": "org/model",
                                                 "local_datasets": [str(DATA / "alpaca.jsonl")]})
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
        wait_until(lambda: client.get(f"/api/jobs/{job_id}").json()["status"] == "completed", 60, "the job to end")
        yield client, f"/api/jobs/{job_id}/log", settings.jobs_dir() / job_id / "worker.log"
    manager.close()


def _get(client: TestClient, url: str, spec: str) -> httpx.Response:
    return client.get(url, headers={"Range": spec})


def test_satisfiable_ranges_answer_206_with_their_bytes(job_log: tuple[TestClient, str, Path]) -> None:
    client, url, log = job_log
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(TEXT)
    suffix = _get(client, url, "bytes=-10")
    assert (suffix.status_code, suffix.text) == (206, "last line\n")
    assert suffix.headers["content-range"] == f"bytes {SIZE - 10}-{SIZE - 1}/{SIZE}"
    longer = _get(client, url, "bytes=-100000")  # longer than the log: the whole log
    assert (longer.status_code, longer.text) == (206, TEXT)
    assert longer.headers["content-range"] == f"bytes 0-{SIZE - 1}/{SIZE}"
    open_end = _get(client, url, "bytes=5-")
    assert (open_end.status_code, open_end.text) == (206, TEXT[5:])
    assert open_end.headers["content-range"] == f"bytes 5-{SIZE - 1}/{SIZE}"
    past_end = _get(client, url, "bytes=0-99999")  # a last position past the end is the end
    assert (past_end.status_code, past_end.text) == (206, TEXT)
    assert past_end.headers["content-range"] == f"bytes 0-{SIZE - 1}/{SIZE}"
    huge_last = _get(client, url, "bytes=0-" + "9" * 5000)  # int() refuses over 4300 digits: was a 500
    assert (huge_last.status_code, huge_last.text) == (206, TEXT)
    huge_suffix = _get(client, url, "bytes=-" + "9" * 5000)
    assert (huge_suffix.status_code, huge_suffix.text) == (206, TEXT)


def test_unsatisfiable_ranges_answer_416_with_the_size(job_log: tuple[TestClient, str, Path]) -> None:
    client, url, log = job_log
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(TEXT)
    for spec in (f"bytes={SIZE}-", f"bytes={SIZE + 10}-{SIZE + 20}", "bytes=-0", "bytes=" + "9" * 5000 + "-",
                 "bytes=99999999999999999999999-", "bytes=5-2", "bytes=0-1,4-5", "lines=1", "bytes=-"):
        answer = _get(client, url, spec)
        assert answer.status_code == 416, (spec, answer.status_code, answer.text)
        assert answer.headers["content-range"] == f"bytes */{SIZE}", spec
        assert answer.json()["detail"]["code"] == "bad_range" and "Traceback" not in answer.text


def test_an_empty_or_missing_log_satisfies_no_first_position(job_log: tuple[TestClient, str, Path]) -> None:
    client, url, log = job_log
    log.unlink(missing_ok=True)
    missing = _get(client, url, "bytes=0-")
    assert missing.status_code == 416 and missing.headers["content-range"] == "bytes */0"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_bytes(b"")
    assert _get(client, url, "bytes=0-10").status_code == 416
    # A non-zero suffix is satisfiable even at zero length (RFC 9110 14.1.1); there is no byte range to name,
    # so the answer is the whole (empty) log, 200.
    empty_suffix = _get(client, url, "bytes=-10")
    assert (empty_suffix.status_code, empty_suffix.text) == (200, "")
    assert "content-range" not in empty_suffix.headers


def test_a_link_in_the_logs_place_is_not_served(job_log: tuple[TestClient, str, Path], tmp_path: Path) -> None:
    """Issue 38 finding 11: worker.log replaced by a link to a file outside the job's folder is refused (404, as
    the file routes refuse a link), live, by range and as a download; the downloads list says there is no log."""
    client, url, log = job_log
    outside = tmp_path / "passwd"
    outside.write_text("root:x:0:0:secret\n")
    log.unlink(missing_ok=True)
    log.symlink_to(outside)
    for answer in (client.get(url), client.get(url, params={"download": "true"}), _get(client, url, "bytes=-10"),
                   client.get(url, params={"tail": 5})):
        assert answer.status_code == 404, (answer.status_code, answer.text)
        assert answer.json()["detail"]["code"] == "not_found" and "secret" not in answer.text
    assert client.get(url.removesuffix("/log") + "/downloads").json()["log"] is False
