"""A flood of dataset previews against a real server, with the job list asked meanwhile: the test
(tests/api/test_preview_flood.py) checks what is answered, bench/preview_flood.py how fast."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tunestudio.settings import Settings

from .jobs import DATA
from .server import running_server
from .wait import wait_until

FLOOD = 60
HOLD_S = 1.0  # how long each preview's child "runs"


@dataclass
class Flood:
    statuses: list[int] = field(default_factory=list)  # each preview's HTTP status
    took: list[float] = field(default_factory=list)  # each job-list request's seconds, during the flood
    during: bool = False  # the flood was still going when the last job-list request answered
    previews_meanwhile: int = 0  # previews that started while the job list answered its requests
    refusals: list[str] = field(default_factory=list)  # a 429's message


def flood_previews(home: Path, monkeypatch: pytest.MonkeyPatch, asks: int = 20) -> Flood:
    """FLOOD previews (each child held HOLD_S), and `asks` GET /api/jobs timed from when the second pair of
    previews runs: the flood has arrived (its parsing is no one's stall), some wait for a slot, more are to come."""
    from tunestudio.api import preview

    started: list[float] = []

    def child(public_config: dict[str, Any], rows: int) -> dict[str, Any]:  # a child that takes HOLD_S
        started.append(time.monotonic())
        time.sleep(HOLD_S)
        return {"format": "alpaca", "detected": True, "rows": []}

    monkeypatch.setattr(preview, "_run_child", child)
    settings = Settings(home=home, dataset_roots=[DATA, home.parent])
    body = {"local_datasets": [str(DATA / "alpaca.jsonl")], "rows": 2}
    result = Flood()

    async def flood(url: str) -> None:
        limits = httpx.Limits(max_connections=FLOOD, max_keepalive_connections=FLOOD)
        async with httpx.AsyncClient(base_url=url, timeout=90, limits=limits) as client:
            answers = await asyncio.gather(*(client.post("/api/web/preview", json=body) for _ in range(FLOOD)))
        result.statuses.extend(a.status_code for a in answers)
        result.refusals.extend(a.json()["detail"]["message"] for a in answers if a.status_code == 429)

    with running_server(settings) as url, httpx.Client(base_url=url, timeout=60) as client:
        assert client.get("/api/jobs").status_code == 200  # the connection is up before the clock starts
        flooding = threading.Thread(target=lambda: asyncio.run(flood(url)), daemon=True)
        flooding.start()
        wait_until(lambda: len(started) > preview.MAX_CHILDREN, 30, "the second pair of previews to start")
        before = len(started)
        for _ in range(asks):
            t0 = time.perf_counter()
            assert client.get("/api/jobs").status_code == 200
            result.took.append(time.perf_counter() - t0)
        result.during = flooding.is_alive()
        result.previews_meanwhile = len(started) - before
        flooding.join(100)
        assert not flooding.is_alive()
    return result
