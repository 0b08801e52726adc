"""API benchmarks over a real uvicorn server on 127.0.0.1.

1. SSE latency: 50 clients on /api/jobs/{id}/events (asyncio + httpx, in a
   separate spawned process, so they do not share the server's GIL) while a
   scripted worker emits progress events at a steady pace, stamping each
   event's `ts` as it puts it on the queue. Latency = client receive time -
   ts (one machine, one clock). The worker holds its progress events until
   every client is connected, so all measured events are live, not replayed.
   Baseline: the same events seen by an in-process manager subscriber
   (worker -> queue -> pump -> manager fan-out, no HTTP). Target p99 <= 50 ms.
2. GET /api/jobs/{id} and GET /api/jobs/{id}/metrics?max_points=1000 on a job
   with a 100k-step history (the scripted flood worker), sequential requests
   from one httpx client. Baselines: GET /healthz (the HTTP floor) and the
   same manager calls in-process. Target p99 <= 20 ms.

    .venv/bin/python bench/api.py
    .venv/bin/python bench/api.py --clients 10 --events 100    # quicker

The last line of output is one JSON object with all figures. This file is
re-imported by spawned children as `__mp_main__`: nothing runs at import.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from timing import percentile, time_calls  # bench/timing.py, beside this script

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CLIENTS = 50
EVENTS = 300
INTERVAL_S = 0.02  # 50 progress events a second
HISTORY_STEPS = 100_000
CALLS = 200
MAX_LATENCY_S = 25.0  # per figure: fewer than CALLS if the calls are slow
TARGET_SSE_P99_MS = 50
TARGET_GET_P99_MS = 20
GO_FILE = "go"  # the paced worker starts its progress events once this file is in output_dir


def _summary(ms: list[float]) -> dict[str, float]:
    if not ms:
        return {"n": 0}
    return {"n": len(ms), "p50_ms": statistics.median(ms), "p99_ms": percentile(ms, 99), "max_ms": max(ms),
            "mean_ms": statistics.fmean(ms)}


# --- the scripted worker (runs in the spawned child) ----------------------------------------
def scripted_worker(args: Any) -> None:
    """max_steps > 1000: the flood worker (a long history, fast). Otherwise paced progress events.

    Paced: after the phase event, wait (<= 60 s) for output_dir/go, then emit max_steps progress
    events every INTERVAL_S, each stamped with ts = time.time() just before it is queued.
    """
    from tests.helpers import fake_workers

    total = int(args.public_config["max_steps"])
    if total > 1000:
        fake_workers.flood(args)
        return
    fake_workers._setup(args)
    events = args.events
    seq = 0

    def emit(kind: str, **fields: Any) -> None:
        nonlocal seq
        seq += 1
        events.put(json.dumps({"kind": kind, "seq": seq, **fields, "ts": time.time()}))

    emit("phase", phase="training")
    go = Path(args.public_config["output_dir"]) / GO_FILE
    deadline = time.monotonic() + 60
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    next_at = time.monotonic()
    for step in range(1, total + 1):
        next_at += INTERVAL_S
        emit("progress", step=step, total_steps=total, loss=1.0 / step, learning_rate=1e-3)
        time.sleep(max(0.0, next_at - time.monotonic()))
    emit("completed", output_dir=None, stopped=False, saved=True, global_step=total)
    events.close()
    events.join_thread()
    sys.exit(0)


# --- the SSE clients (a spawned child) ---------------------------------------------------------
def _sse_clients(url: str, n: int, ready: Any, out_path: str, timeout: float) -> None:
    import asyncio
    import resource

    import httpx

    connected = 0

    async def client(http: httpx.AsyncClient) -> dict[str, Any]:
        nonlocal connected
        lat: list[float] = []
        got_first = False
        kind, data = "message", ""
        async with http.stream("GET", url) as response:
            async for line in response.aiter_lines():
                if line == "":
                    if data:
                        now = time.time()
                        if kind == "progress":
                            body = json.loads(data)
                            lat.append((body["step"], (now - body["ts"]) * 1000))
                        if not got_first:
                            got_first = True
                            connected += 1
                            if connected == n:
                                ready.set()
                        if kind == "status" and json.loads(data)["status"] in ("completed", "failed", "cancelled"):
                            break
                    kind, data = "message", ""
                elif line.startswith("event:"):
                    kind = line[6:].strip()
                elif line.startswith("data:"):
                    data = line[5:].strip()
        return {"latencies": lat}

    async def run() -> list[Any]:
        limits = httpx.Limits(max_connections=n + 10, max_keepalive_connections=n + 10)
        async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(30.0)) as http:
            tasks = [client(http) for _ in range(n)]
            return await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout)

    results = asyncio.run(run())
    lat: list[tuple[int, float]] = []
    errors: list[str] = []
    per_client: list[int] = []
    for r in results:
        if isinstance(r, BaseException):
            errors.append(repr(r))
        else:
            lat.extend(r["latencies"])
            per_client.append(len(r["latencies"]))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    Path(out_path).write_text(json.dumps({"latencies": lat, "errors": errors, "per_client": per_client,
                                          "cpu_s": usage.ru_utime + usage.ru_stime}))


def sse_latency(base: str, manager: Any, home: Path, clients: int, n_events: int) -> dict[str, Any]:
    from tests.helpers.jobs import job_config

    out_dir = home / "paced-out"
    job = manager.submit(job_config("unused-model", out_dir, max_steps=n_events))
    in_process: list[float] = []

    def deliver(event: Any) -> None:
        if event.kind == "progress":
            in_process.append((time.time() - event.data["ts"]) * 1000)

    sub = manager.subscribe(job.id, deliver=deliver)
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    out_path = home / "sse.json"
    budget = 60 + n_events * INTERVAL_S
    proc = ctx.Process(target=_sse_clients, args=(f"{base}/api/jobs/{job.id}/events", clients, ready,
                                                  str(out_path), budget))
    proc.start()
    connected = ready.wait(60)
    out_dir.mkdir(parents=True, exist_ok=True)
    cpu0, t0 = time.process_time(), time.perf_counter()
    (out_dir / GO_FILE).touch()  # release the worker's progress events (also if not all connected: bounded)
    proc.join(budget + 30)
    server_cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    if proc.is_alive():
        proc.kill()
    sub.close()
    status = manager.get(job.id).status.value
    raw = json.loads(out_path.read_text()) if out_path.exists() else {"latencies": [], "errors": ["no output"],
                                                                       "per_client": []}
    by_step: dict[int, list[float]] = {}
    for step, ms in raw["latencies"]:
        by_step.setdefault(step, []).append(ms)
    return {
        "job_status": status,
        "all_connected": connected,
        "clients": clients,
        "events_per_client_min": min(raw["per_client"], default=0),
        "errors": raw["errors"][:3],
        # CPU seconds while the events flowed: this process (server + manager) and the clients' process
        "server_cpu_s": server_cpu,
        "clients_cpu_s_total": raw.get("cpu_s"),
        "wall_s": wall,
        "sse": _summary([ms for _, ms in raw["latencies"]]),
        # per event: the first and the last of the clients to hear it (the spread is the fan-out)
        "sse_first_client": _summary([min(v) for v in by_step.values()]),
        "sse_last_client": _summary([max(v) for v in by_step.values()]),
        "in_process": _summary(in_process),
    }


# --- GET latencies -----------------------------------------------------------------------------
def timed(fn: Any, calls: int = CALLS, max_seconds: float = MAX_LATENCY_S) -> dict[str, float]:
    return _summary(time_calls(fn, calls, max_seconds))


def get_latency(base: str, manager: Any, home: Path, steps: int) -> dict[str, Any]:
    import httpx

    from tests.helpers.jobs import job_config

    t0 = time.perf_counter()
    job = manager.submit(job_config("unused-model", home / "flood-out", max_steps=steps))
    deadline = time.monotonic() + 180
    while not manager.get(job.id).status.is_terminal and time.monotonic() < deadline:
        time.sleep(0.05)
    history_s = time.perf_counter() - t0
    rows = len(manager.metrics(job.id))

    def check(response: httpx.Response) -> httpx.Response:
        response.raise_for_status()
        return response

    with httpx.Client(base_url=base, timeout=30.0) as http:
        points = len(check(http.get(f"/api/jobs/{job.id}/metrics", params={"max_points": 1000})).json()["records"])
        figures = {
            "history_rows": rows,
            "history_seconds": history_s,
            "points_returned": points,
            "healthz": timed(lambda: check(http.get("/healthz"))),
            "get_job": timed(lambda: check(http.get(f"/api/jobs/{job.id}"))),
            "get_job_in_process": timed(lambda: manager.get(job.id)),
            "metrics": timed(lambda: check(http.get(f"/api/jobs/{job.id}/metrics", params={"max_points": 1000}))),
            "metrics_in_process": timed(lambda: manager.metrics(job.id, max_points=1000), max_seconds=15.0),
        }
    return figures


# --- the run -------------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=CLIENTS)
    parser.add_argument("--events", type=int, default=EVENTS)
    parser.add_argument("--history-steps", type=int, default=HISTORY_STEPS)
    args = parser.parse_args()

    from tests.helpers.server import running_server
    from tunestudio.jobs.manager import JobManager
    from tunestudio.settings import Settings

    out: dict[str, Any] = {"benchmark": "api", "clients": args.clients, "events": args.events,
                           "history_steps": args.history_steps}
    with tempfile.TemporaryDirectory(prefix="tunestudio-bench-api-") as raw:
        home = Path(raw)
        # Spawned workers: the scripted worker needs nothing from the prewarm forkserver.
        extra = {"prewarm": False} if "prewarm" in Settings.model_fields else {}
        settings = Settings(home=home / "home", **extra)
        manager = JobManager(settings, worker_target=scripted_worker)
        try:
            with running_server(settings, manager) as base:
                print(f"server {base}", flush=True)
                print(f"1. SSE: {args.clients} clients, {args.events} progress events at "
                      f"{1 / INTERVAL_S:.0f}/s", flush=True)
                sse = sse_latency(base, manager, home, args.clients, args.events)
                s, b = sse["sse"], sse["in_process"]
                ratio = s.get("p99_ms", 0) / b["p99_ms"] if b.get("p99_ms") else None
                met = sse["all_connected"] and s.get("n", 0) > 0 and s["p99_ms"] <= TARGET_SSE_P99_MS
                print(f"   baseline in-process subscriber: p50 {b.get('p50_ms', 0):.2f} ms, "
                      f"p99 {b.get('p99_ms', 0):.2f} ms ({b.get('n', 0)} events)", flush=True)
                fc, lc = sse["sse_first_client"], sse["sse_last_client"]
                print(f"   per event, first client to hear it: p50 {fc.get('p50_ms', 0):.2f} ms, "
                      f"p99 {fc.get('p99_ms', 0):.2f} ms; last client: p50 {lc.get('p50_ms', 0):.2f} ms, "
                      f"p99 {lc.get('p99_ms', 0):.2f} ms", flush=True)
                print(f"   SSE worker->client: p50 {s.get('p50_ms', 0):.2f} ms, p99 {s.get('p99_ms', 0):.2f} ms, "
                      f"max {s.get('max_ms', 0):.1f} ms ({s.get('n', 0)} deliveries, "
                      f">= {sse['events_per_client_min']} per client, all connected: {sse['all_connected']}, "
                      f"errors: {sse['errors']}, job {sse['job_status']}; CPU s server {sse['server_cpu_s']:.1f}, "
                      f"clients {sse['clients_cpu_s_total'] or 0:.1f} (incl. start-up), wall {sse['wall_s']:.1f}); "
                      f"p99 ratio to baseline {ratio if ratio is None else f'{ratio:.1f}'}; "
                      f"target p99 <= {TARGET_SSE_P99_MS} ms: {'met' if met else 'MISSED'}", flush=True)
                out["sse"] = {**sse, "p99_ratio": ratio, "target_p99_ms": TARGET_SSE_P99_MS, "met": met}

                print(f"2. GET latencies at a {args.history_steps:,}-step history", flush=True)
                g = get_latency(base, manager, home, args.history_steps)
                print(f"   history: {g['history_rows']:,} rows in {g['history_seconds']:.1f} s", flush=True)
                for name in ("healthz", "get_job_in_process", "get_job", "metrics_in_process", "metrics"):
                    f = g[name]
                    print(f"   {name:20s} p50 {f['p50_ms']:8.2f} ms  p99 {f['p99_ms']:8.2f} ms  ({f['n']} calls)",
                          flush=True)
                job_ratio = g["get_job"]["p99_ms"] / g["healthz"]["p99_ms"]
                metrics_ratio = g["metrics"]["p99_ms"] / g["metrics_in_process"]["p99_ms"]
                job_met = g["get_job"]["p99_ms"] <= TARGET_GET_P99_MS
                metrics_met = g["metrics"]["p99_ms"] <= TARGET_GET_P99_MS
                print(f"   GET /api/jobs/{{id}}: p99 ratio to /healthz {job_ratio:.1f}; "
                      f"target p99 <= {TARGET_GET_P99_MS} ms: {'met' if job_met else 'MISSED'}", flush=True)
                print(f"   GET /metrics?max_points=1000 ({g['points_returned']} points): p99 ratio to in-process "
                      f"{metrics_ratio:.2f}; target p99 <= {TARGET_GET_P99_MS} ms: "
                      f"{'met' if metrics_met else 'MISSED'}", flush=True)
                out["get"] = {**g, "get_job_p99_ratio_to_healthz": job_ratio,
                              "metrics_p99_ratio_to_in_process": metrics_ratio,
                              "target_p99_ms": TARGET_GET_P99_MS, "get_job_met": job_met, "metrics_met": metrics_met}
        finally:
            manager.close(save=False, timeout=10)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
