"""A hostile web page and a hostile client against a real server: Host, origin, content type, headers, token."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr, ValidationError

from tunestudio.api import create_app
from tunestudio.api.security import split_host, token_ok
from tunestudio.jobs.manager import JobManager
from tunestudio.settings import Settings

from ..helpers import fake_workers
from ..helpers.jobs import DATA
from ..helpers.server import read_sse, running_server
from ..helpers.wait import wait_until

JSON = {"Content-Type": "application/json"}
PAGES = ["/", "/index.html", "/js/api.js", "/style.css", "/healthz", "/api/jobs", "/openapi.json", "/docs",
         "/api/web/defaults", "/nope"]


def settings(tmp_path: Path, **overrides: object) -> Settings:
    return Settings(home=tmp_path / "home", dataset_roots=[DATA, tmp_path], sse_heartbeat_seconds=0.2, **overrides)


def job_body(tmp_path: Path) -> dict:
    return {"model_name": "org/fake", "local_datasets": [str(DATA / "alpaca.jsonl")],
            "output_dir": str(tmp_path / "home" / "out")}


def state_changing_routes(job_id: str) -> list[tuple[str, str]]:
    """Every POST/PUT/PATCH/DELETE route the app has (a new route is covered without editing this test)."""
    paths = create_app(Settings()).openapi()["paths"]
    return [(method.upper(), path.replace("{job_id}", job_id)) for path, item in paths.items() for method in item
            if method.upper() in ("POST", "PUT", "PATCH", "DELETE")]


def test_split_host_reads_names_ports_and_ipv6_brackets() -> None:
    assert split_host("LocalHost:8765") == ("localhost", 8765)
    assert split_host("[::1]:8765") == ("::1", 8765)
    assert split_host("[::1]") == ("::1", None)
    assert split_host("127.0.0.1") == ("127.0.0.1", None)
    assert split_host("example.com.") == ("example.com", None)
    for bad in ("", "[::1", "localhost:abc", "localhost:", ":8765", "a:1234567"):
        assert split_host(bad) is None, bad


def test_foreign_host_is_refused_on_every_route_including_the_page(tmp_path: Path) -> None:
    with running_server(settings(tmp_path, allowed_hosts="studio.lan, other.lan")) as url, \
            httpx.Client(base_url=url, timeout=30) as client:
        port = url.rsplit(":", 1)[1]
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "localhost", f"studio.lan:{port}",
                     "other.lan"):
            got = client.get("/", headers={"Host": host})
            assert got.status_code == 200, host
        # DNS rebinding: the attacker's own name resolves to 127.0.0.1, so the Host names the attacker.
        for host in ("evil.example", f"evil.example:{port}", f"127.0.0.1.evil.example:{port}", "[::1",
                     f"localhost:{port}x", "studio.lan.evil.example"):
            for path in PAGES:
                got = client.get(path, headers={"Host": host})
                assert got.status_code == 400, (host, path, got.status_code)
                assert got.json()["detail"]["code"] == "bad_host"
            refused = client.post("/api/jobs", json=job_body(tmp_path), headers={"Host": host})
            assert refused.status_code == 400
        assert client.get("/api/jobs").json()["total"] == 0


def test_a_star_turns_the_host_check_off(tmp_path: Path) -> None:
    with running_server(settings(tmp_path, allowed_hosts='["*"]')) as url, httpx.Client(base_url=url) as client:
        assert client.get("/healthz", headers={"Host": "proxy.example"}).status_code == 200


def test_cross_site_and_non_json_state_changes_are_refused_on_every_route(tmp_path: Path) -> None:
    config = settings(tmp_path)
    manager = JobManager(config, worker_target=fake_workers.instant)
    with running_server(config, manager) as url, httpx.Client(base_url=url, timeout=30) as client:
        created = client.post("/api/jobs", json=job_body(tmp_path), headers={"Origin": url})
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
        wait_until(lambda: client.get(f"/api/jobs/{job_id}").json()["status"] == "completed", 30, "the job to end")
        routes = state_changing_routes(job_id)
        assert {("POST", f"/api/jobs/{job_id}/cancel"), ("POST", "/api/train/stop"), ("POST", "/api/train/reset"),
                ("DELETE", f"/api/jobs/{job_id}"), ("POST", "/api/train/start")} <= set(routes)
        form = "model_name=x&output_dir=/"
        multipart = {"headers": {"Content-Type": "multipart/form-data; boundary=b"}, "content": "--b--"}
        attempts = [
            # What an HTML form on another site can send without a preflight.
            {"headers": {"Content-Type": "application/x-www-form-urlencoded"}, "content": form},
            {"headers": {"Content-Type": "text/plain"}, "content": '{"model_name": "x"}'},
            multipart,
            {"headers": {"Content-Type": "multipart/form-data; boundary=b", "Origin": "http://evil.example"},
             "content": "--b--"},
            {"headers": {}, "content": b""},  # bodyless, no content type: a form post with no fields
            # JSON, but from another origin (a preflight would have failed; a non-browser lies anyway).
            {"headers": {**JSON, "Origin": "http://evil.example"}, "content": "{}"},
            {"headers": {**JSON, "Origin": "null"}, "content": "{}"},
            {"headers": {**JSON, "Origin": f"http://evil.example:{url.rsplit(':', 1)[1]}"}, "content": "{}"},
            {"headers": {**JSON, "Referer": "http://evil.example/page"}, "content": "{}"},
        ]
        for method, path in routes:
            for attempt in attempts:
                if (method, path) in (("POST", "/v1/files"), ("POST", "/v1/audio/transcriptions")) \
                        and attempt is multipart:
                    continue  # OpenAI's SDKs upload so, with no Origin: taken (README, security model)
                got = client.request(method, path, **attempt)
                assert got.status_code == 403, (method, path, attempt, got.status_code)
                shape = "error" if path.startswith("/v1/") else "detail"  # /v1: OpenAI's error shape
                assert got.json()[shape]["code"] in ("cross_origin", "json_required")
        assert client.get("/api/jobs").json()["total"] == 1
        assert client.get(f"/api/jobs/{job_id}").status_code == 200  # the DELETE never reached the route
        # The page's own requests: JSON, same origin (Origin or Referer of this server), a charset is fine.
        same = {"Content-Type": "application/json; charset=utf-8", "Origin": url}
        assert client.post("/api/train/reset", content="{}", headers=same).status_code == 200
        assert client.post("/api/train/stop", content="{}", headers={**JSON, "Referer": f"{url}/"}).status_code == 200
        assert client.post(f"/api/jobs/{job_id}/cancel", json={}).status_code == 409  # it has ended: the route ran
        assert client.delete(f"/api/jobs/{job_id}", headers=same).status_code == 204
        assert client.get("/api/jobs").json()["total"] == 0
    manager.close()


def test_every_answer_forbids_framing_and_sniffing(tmp_path: Path) -> None:
    with running_server(settings(tmp_path, max_body_bytes=2048)) as url, \
            httpx.Client(base_url=url, timeout=30) as client:
        answers = [client.get(path) for path in PAGES]
        answers += [
            client.get("/", headers={"Host": "evil.example"}),  # 400
            client.post("/api/jobs", content="x", headers={"Content-Type": "text/plain"}),  # 403
            client.post("/api/jobs", content="{" + " " * 4000 + "}", headers=JSON),  # 413
            client.post("/api/jobs", json={"model_name": 3}),  # 422
            client.get("/api/jobs/nope"),  # 404
        ]
        assert {a.status_code for a in answers} >= {200, 400, 403, 404, 413, 422}
        for answer in answers:
            assert answer.headers["x-frame-options"] == "DENY", answer.request.url
            assert answer.headers["x-content-type-options"] == "nosniff", answer.request.url


def test_a_blank_token_is_refused_and_never_matches(tmp_path: Path) -> None:
    for blank in ("", "   ", "\t\n"):
        with pytest.raises(ValidationError, match="TUNESTUDIO_API_TOKEN is blank"):
            Settings(home=tmp_path, api_token=blank)
    # Even if a blank token got past the settings, an empty bearer would not match it.
    unchecked = Settings.model_construct(api_token=SecretStr(""))
    assert not token_ok(unchecked, "Bearer ") and not token_ok(unchecked, "Bearer")
    real = Settings(home=tmp_path, api_token=" s3cret ")
    assert token_ok(real, "Bearer s3cret") and not token_ok(real, "Bearer ") and not token_ok(real, None)

    env = {**os.environ, "TUNESTUDIO_HOME": str(tmp_path / "home"), "TUNESTUDIO_API_TOKEN": "  "}
    for command in (["serve", "--port", "1"], ["jobs", "list"]):
        proc = subprocess.run([sys.executable, "-m", "tunestudio.cli", *command], capture_output=True, text=True,
                              env=env, timeout=60)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "TUNESTUDIO_API_TOKEN is blank" in proc.stderr and "Traceback" not in proc.stderr + proc.stdout


def test_the_query_token_opens_event_streams_only(tmp_path: Path) -> None:
    config = settings(tmp_path, api_token="s3cret")
    manager = JobManager(config, worker_target=fake_workers.instant)
    bearer = {"Authorization": "Bearer s3cret"}
    with running_server(config, manager) as url, httpx.Client(base_url=url, timeout=30) as client:
        job_id = client.post("/api/jobs", json=job_body(tmp_path), headers=bearer).json()["id"]
        token = {"access_token": "s3cret"}
        assert client.get("/api/jobs", params=token).status_code == 401
        assert client.get(f"/api/jobs/{job_id}", params=token).status_code == 401
        assert client.get(f"/api/jobs/{job_id}/metrics", params=token).status_code == 401
        assert client.post("/api/train/reset", params=token, json={}).status_code == 401
        assert client.get(f"/api/jobs/{job_id}", headers={"Authorization": "Bearer"}).status_code == 401
        assert client.get(f"/api/jobs/{job_id}", headers=bearer).status_code == 200
        with client.stream("GET", f"/api/jobs/{job_id}/events", params=token) as stream:
            assert stream.status_code == 200
            assert [e.json()["status"] for e in read_sse(stream) if e.event == "status"][-1] == "completed"
        with client.stream("GET", "/api/train/progress", params=token) as stream:
            assert stream.status_code == 200
        with client.stream("GET", f"/api/jobs/{job_id}/events", params={"access_token": "wrong"}) as stream:
            assert stream.status_code == 401
    manager.close()
