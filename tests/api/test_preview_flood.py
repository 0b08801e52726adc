"""A flood of dataset previews must not stall the other routes (issue 30): a waiting preview holds no thread."""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tunestudio.settings import Settings

from ..helpers.jobs import DATA
from ..helpers.server import running_server
from ..helpers.wait import wait_until

FLOOD = 60
HOLD_S = 1.0  # how long each preview's child "runs"


@pytest.mark.timeout(120)
def test_a_preview_flood_leaves_the_job_list_quick_and_every_preview_answers_200_or_429(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tunestudio.api import preview

    started: list[float] = []

    def child(public_config: dict[str, Any], rows: int) -> dict[str, Any]:  # a child that takes HOLD_S
        started.append(time.monotonic())
        time.sleep(HOLD_S)
        return {"format": "alpaca", "detected": True, "rows": []}

    monkeypatch.setattr(preview, "_run_child", child)
    settings = Settings(home=tmp_path / "home", dataset_roots=[DATA, tmp_path])
    body = {"local_datasets": [str(DATA / "alpaca.jsonl")], "rows": 2}
    statuses: list[int] = []

    async def flood(url: str) -> None:
        limits = httpx.Limits(max_connections=FLOOD, max_keepalive_connections=FLOOD)
        async with httpx.AsyncClient(base_url=url, timeout=90, limits=limits) as client:
            answers = await asyncio.gather(*(client.post("/api/web/preview", json=body) for _ in range(FLOOD)))
        statuses.extend(a.status_code for a in answers)
        for answer in answers:
            if answer.status_code == 429:
                assert "try again in a moment" in answer.json()["detail"]["message"]

    with running_server(settings) as url, httpx.Client(base_url=url, timeout=60) as client:
        assert client.get("/api/jobs").status_code == 200  # the connection is up before the clock starts
        flooding = threading.Thread(target=lambda: asyncio.run(flood(url)), daemon=True)
        flooding.start()
        # Timed from when the second pair of previews runs: the flood has arrived (its parsing is no
        # one's stall), some previews wait for a slot, and more are still to come.
        wait_until(lambda: len(started) > preview.MAX_CHILDREN, 30, "the second pair of previews to start")
        took = []
        for _ in range(20):
            t0 = time.perf_counter()
            assert client.get("/api/jobs").status_code == 200
            took.append(time.perf_counter() - t0)
        assert flooding.is_alive(), "the flood was over before the job list was timed"
        flooding.join(100)
        assert not flooding.is_alive()

    p99 = statistics.quantiles(took, n=100, method="inclusive")[98]
    print(f"GET /api/jobs during a flood of {FLOOD} previews: p50 {statistics.median(took) * 1000:.1f} ms, "
          f"p99 {p99 * 1000:.1f} ms; previews: {statuses.count(200)} x 200, {statuses.count(429)} x 429")
    assert p99 < 0.1, f"GET /api/jobs p99 {p99 * 1000:.0f} ms during the flood: {[round(t, 3) for t in took]}"
    assert len(statuses) == FLOOD and set(statuses) <= {200, 429}, statuses
    assert statuses.count(200) >= preview.MAX_CHILDREN  # the flood is served, not only refused
