"""Orchestrator benchmarks: the parent side of tunestudio under load.

1. pump + store throughput: a JobManager running the scripted `flood` worker
   (tests/helpers/fake_workers.py) with max_steps=100_000, one progress event
   per step. Figure: events in the store / seconds from submit to the job's
   final status. Baseline: the same worker pushing through a bare
   multiprocessing queue that the parent only drains with a blocking get()
   (no parsing, no store); also shown, the same drained with the pump's
   get(timeout=0.1).
   Target >= 50,000 events/s.
2. parent RSS during a real job: the tiny model (models/tiny-llama from
   `make setup`, else built in a spawned child: minutes), 60 LoRA steps
   through a JobManager with the default worker, in a fresh Python process
   whose RSS is sampled every 0.1 s from outside (psutil).
   Baseline: a bare `python -c "import tunestudio.jobs.manager"`. Target <= 150 MB.
3. manager.metrics(job_id, max_points=1000) on a 100k-step job: on the
   finished job from 1 (first call, then cached: p50/p99 over 200 calls), and
   on a live one, polled back to back while its last 3,000 steps arrive one per
   millisecond (each call folds in the new rows). Baseline: the raw store read,
   a full fresh read of every record. Target p99 <= 20 ms, both cases.

    .venv/bin/python bench/orchestrator.py                 # everything
    .venv/bin/python bench/orchestrator.py --skip-rss      # 1 and 3 only (no torch needed)

The last line of output is one JSON object with all figures.
Heavy libraries load only in spawned children; this file is re-imported by
them as `__mp_main__`, so nothing runs at import time.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from timing import percentile, time_calls  # bench/timing.py, beside this script

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TINY = ROOT / "models" / "tiny-llama"
STEPS = 100_000
RSS_STEPS = 60
TARGET_EVENTS_PER_S = 50_000
TARGET_RSS_MB = 150
TARGET_METRICS_P99_MS = 20
MIB = 1024 * 1024
CALLS = 200  # latency samples per figure ...
MAX_LATENCY_S = 20.0  # ... unless this many seconds pass first (a ~1 s call gets ~20)


def _wait_final(manager: Any, job_id: str, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = manager.get(job_id)
        if job.status.is_terminal:
            return job
        time.sleep(0.005)
    raise TimeoutError(f"job {job_id} did not end within {timeout:.0f}s")


# --- 1. throughput -------------------------------------------------------------------
def bare_queue_rate(steps: int, polled: bool, timeout: float = 120.0) -> dict[str, float]:
    """The flood worker into a bare spawn-context queue, drained by the parent with no processing.

    polled=False: blocking get() (the worker's push rate; a watchdog puts a sentinel if the worker dies).
    polled=True: get(timeout=0.1), the call the supervisor's pump makes for every event.
    """
    from tests.helpers.fake_workers import flood

    ctx = mp.get_context("spawn")
    events, commands = ctx.Queue(), ctx.Queue()
    t0 = time.perf_counter()
    proc = ctx.Process(target=flood, args=({"max_steps": steps}, {}, events, commands, os.getpid(), None))
    proc.start()

    def watchdog() -> None:
        proc.join(timeout)
        time.sleep(1.0)  # let the parent drain what the worker flushed before it exited
        events.put(None)

    threading.Thread(target=watchdog, daemon=True).start()
    expected = steps + 2  # phase, steps x progress, completed
    got = 0
    first = None
    deadline = time.monotonic() + timeout
    while got < expected and time.monotonic() < deadline:
        if polled:
            try:
                item = events.get(timeout=0.1)
            except queue.Empty:
                continue
        else:
            item = events.get()
        if item is None:
            break
        if first is None:
            first = time.perf_counter()
        # The worker channel sends a burst of events as one newline-joined item.
        got += item.count("\n") + 1 if isinstance(item, str) else 1
    t1 = time.perf_counter()
    proc.join(10)
    return {
        "events": got,
        "seconds": t1 - t0,
        "events_per_s": got / (t1 - t0),
        # without the ~0.1-0.3 s interpreter start of the spawned child:
        "events_per_s_after_first": (got - 1) / (t1 - first) if first and got > 1 else 0.0,
    }


def manager_rate(home: Path, steps: int, timeout: float = 150.0) -> tuple[dict[str, float], Any, str]:
    """Submit the flood job to a JobManager; events in the store / seconds to the final status.

    Returns the figures, the (still open) manager and the job id, for the metrics benchmark.
    """
    from tests.helpers.fake_workers import flood
    from tests.helpers.jobs import job_config
    from tunestudio.jobs.manager import JobManager
    from tunestudio.settings import Settings

    # Workers are spawned (not forked from the prewarm forkserver, which would first import torch):
    # this figure is about the pump and the store, and the flood worker needs nothing preloaded.
    extra = {"prewarm": False} if "prewarm" in Settings.model_fields else {}
    manager = JobManager(Settings(home=home, **extra), worker_target=flood).start()
    cfg = job_config("unused-model", home / "out", max_steps=steps)
    t0 = time.perf_counter()
    job = manager.submit(cfg)
    final = _wait_final(manager, job.id, timeout)
    t1 = time.perf_counter()
    manager.flush()
    with manager.subscribe(job.id) as stream:
        n_events = sum(1 for _ in stream.replay)  # the job's whole stream, as a replay reads it
    manager.views.clear()
    n_metrics = len(manager.metrics(job.id))
    figures = {
        "status": final.status.value,
        "events": n_events,
        "metric_rows": n_metrics,
        "seconds": t1 - t0,
        "events_per_s": n_events / (t1 - t0),
    }
    return figures, manager, job.id


# --- 3. metrics latency --------------------------------------------------------------
def latency(fn: Any, calls: int, max_seconds: float) -> dict[str, float]:
    """Call fn `calls` times, or fewer if max_seconds pass first (the figures say how many ran)."""
    times = time_calls(fn, calls, max_seconds)  # after a warm-up call: the reader connection, the page cache
    if not times:
        raise RuntimeError(f"no timed call fitted in {max_seconds} s after the warm-up")
    return {
        "calls": len(times),
        "p50_ms": statistics.median(times),
        "p99_ms": percentile(times, 99),
        "max_ms": max(times),
        "mean_ms": statistics.fmean(times),
    }


def metrics_latency(manager: Any, job_id: str) -> dict[str, Any]:
    """On the finished job: the first (cold) call, the cached view, and the baseline full read."""
    manager.views.clear()  # the flood run may have left a view; time the first build
    t0 = time.perf_counter()
    points = len(manager.metrics(job_id, max_points=1000))
    cold_ms = (time.perf_counter() - t0) * 1000
    view = latency(lambda: manager.metrics(job_id, max_points=1000), CALLS, MAX_LATENCY_S)

    def full_read() -> None:  # every record, read afresh from the store
        manager.views.clear()
        manager.metrics(job_id)

    raw = latency(full_read, CALLS, MAX_LATENCY_S)
    return {"points_returned": points, "first_call_ms": cold_ms, "metrics_view": view, "store_read": raw}


def live_metrics_latency(home: Path, steps: int, timeout: float = 150.0) -> dict[str, Any]:
    """A chart polling a live 100k-step job: the flood worker's last 3,000 steps come one per ms,
    and metrics(max_points=1000) is called back to back while they arrive, so (almost) every
    call finds new rows and its cached view out of date."""
    from tests.helpers.fake_workers import flood_then_live
    from tests.helpers.jobs import job_config
    from tunestudio.jobs.manager import JobManager
    from tunestudio.settings import Settings

    live_from = steps - 3000
    with JobManager(Settings(home=home, prewarm=False), worker_target=flood_then_live) as manager:
        job = manager.submit(job_config("unused-model", home / "out", max_steps=steps))
        deadline = time.monotonic() + timeout
        while (manager.get(job.id).progress or {}).get("step", 0) < live_from:
            if time.monotonic() > deadline:
                raise TimeoutError("the flood did not reach its live part")
            time.sleep(0.01)
        times: list[float] = []  # calls that found new rows: the cached answer was out of date
        calls = 0
        last_step = manager.metrics(job.id, max_points=1000)[-1]["step"]
        while not manager.get(job.id).status.is_terminal and time.monotonic() < deadline:
            t0 = time.perf_counter()
            view = manager.metrics(job.id, max_points=1000)
            elapsed = (time.perf_counter() - t0) * 1000
            calls += 1
            assert len(view) <= 1000 and view[0]["step"] == 1
            if view[-1]["step"] > last_step:
                times.append(elapsed)
            last_step = view[-1]["step"]
    if not times:
        raise RuntimeError("no metrics call found new rows: the live part ended before the first call")
    return {"calls": calls, "calls_with_new_rows": len(times), "p50_ms": statistics.median(times),
            "p99_ms": percentile(times, 99), "max_ms": max(times), "last_step_seen": last_step}


# --- 2. parent RSS during a real job -------------------------------------------------------
def _build_tiny(directory: str) -> None:
    from tunestudio.worker.tiny import build_tiny_model

    build_tiny_model(directory)


def _rss_child(home: str, model: str, steps: int) -> None:
    """Runs in a fresh interpreter: one real job through a JobManager with the default worker."""
    from tests.helpers.jobs import job_config
    from tunestudio.jobs.manager import JobManager
    from tunestudio.settings import Settings

    heavy = ("torch", "transformers", "peft", "trl", "datasets", "bitsandbytes")
    with JobManager(Settings(home=Path(home))) as manager:
        print("READY", flush=True)
        job = manager.submit(job_config(model, Path(home) / "out", max_steps=steps))
        final = _wait_final(manager, job.id, 600)
        loaded = sorted(m for m in heavy if m in sys.modules)
        last = (final.progress or {}).get("step")
        print("RESULT " + json.dumps({"status": final.status.value, "last_step": last, "heavy_loaded": loaded}),
              flush=True)


def bare_import_rss() -> float:
    code = (
        "import tunestudio.jobs.manager\n"
        "for line in open('/proc/self/status'):\n"
        "    if line.startswith('VmRSS:'): print(int(line.split()[1]) * 1024)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    return int(out.stdout.strip()) / MIB


def tiny_model(tmp: Path, wanted: Path | None) -> tuple[Path, float]:
    """models/tiny-llama (what `make setup` builds) if it is there; otherwise build one in a spawned child."""
    for candidate in (wanted, TINY):
        if candidate is not None and (candidate / "config.json").is_file():
            return candidate, 0.0
    model = wanted or tmp / "tiny-model"
    t0 = time.perf_counter()
    proc = mp.get_context("spawn").Process(target=_build_tiny, args=(str(model),))
    proc.start()
    proc.join(600)
    if proc.exitcode != 0:
        raise RuntimeError("building the tiny model failed")
    return model, time.perf_counter() - t0


def parent_rss(tmp: Path, steps: int, wanted_model: Path | None) -> dict[str, Any]:
    import psutil

    model, build_s = tiny_model(tmp, wanted_model)

    home = tmp / "rss-home"
    cmd = [sys.executable, "-c",
           "import sys; sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[2]);"
           "import orchestrator; orchestrator._rss_child(sys.argv[3], sys.argv[4], int(sys.argv[5]))",
           str(ROOT), str(Path(__file__).parent), str(home), str(model), str(steps)]
    child = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    watched = psutil.Process(child.pid)
    samples: list[float] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            try:
                samples.append(watched.memory_info().rss / MIB)
            except psutil.Error:
                return
            stop.wait(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t1 = time.perf_counter()
    result: dict[str, Any] = {}
    assert child.stdout is not None
    for line in child.stdout:
        if line.startswith("RESULT "):
            result = json.loads(line[7:])
    child.wait(300)
    stop.set()
    sampler.join()
    return {
        "peak_mb": max(samples),
        "median_mb": statistics.median(samples),
        "samples": len(samples),
        "job_seconds": time.perf_counter() - t1,
        "model": str(model),
        "model_build_seconds": build_s,
        **result,
    }


# --- the run -------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--rss-steps", type=int, default=RSS_STEPS)
    parser.add_argument("--skip-rss", action="store_true")
    parser.add_argument("--model", type=Path, default=None,
                        help=f"the tiny model's folder (default {TINY} if built, else one is built: minutes)")
    args = parser.parse_args()

    out: dict[str, Any] = {"benchmark": "orchestrator", "steps": args.steps}
    with tempfile.TemporaryDirectory(prefix="tunestudio-bench-") as raw:
        tmp = Path(raw)

        print(f"1. throughput: flood worker, {args.steps:,} progress events", flush=True)
        base = bare_queue_rate(args.steps, polled=False)
        print(f"   baseline (bare mp queue, blocking get, nothing stored): {base['events_per_s']:,.0f} events/s "
              f"({base['events']:,} in {base['seconds']:.2f} s; "
              f"{base['events_per_s_after_first']:,.0f}/s after the first event)", flush=True)
        polled = bare_queue_rate(args.steps, polled=True)
        print(f"   bare mp queue drained with get(timeout=0.1) as the pump does: {polled['events_per_s']:,.0f} "
              f"events/s ({polled['events_per_s_after_first']:,.0f}/s after the first event)", flush=True)
        pumped, manager, job_id = manager_rate(tmp / "home", args.steps)
        ratio = pumped["events_per_s"] / base["events_per_s"]
        print(f"   JobManager (pump + store): {pumped['events_per_s']:,.0f} events/s "
              f"({pumped['events']:,} events, {pumped['metric_rows']:,} metric rows in {pumped['seconds']:.2f} s, "
              f"job {pumped['status']}); ratio to baseline {ratio:.3f}; "
              f"target >= {TARGET_EVENTS_PER_S:,}: "
              f"{'met' if pumped['events_per_s'] >= TARGET_EVENTS_PER_S else 'MISSED'}", flush=True)
        out["throughput"] = {"baseline": base, "bare_polled": polled, "manager": pumped, "ratio": ratio,
                             "target_events_per_s": TARGET_EVENTS_PER_S,
                             "met": pumped["events_per_s"] >= TARGET_EVENTS_PER_S}

        print(f"3. manager.metrics(max_points=1000) on the {args.steps:,}-step job", flush=True)
        try:
            lat = metrics_latency(manager, job_id)
        finally:
            manager.close()
        view, raw_read = lat["metrics_view"], lat["store_read"]
        print(f"   baseline store.metrics (all rows): p50 {raw_read['p50_ms']:.1f} ms, p99 {raw_read['p99_ms']:.1f} ms "
              f"({raw_read['calls']} calls)", flush=True)
        print(f"   finished job: first call {lat['first_call_ms']:.0f} ms (builds the view); then cached, "
              f"{lat['points_returned']} points: p50 {view['p50_ms']:.4f} ms, p99 {view['p99_ms']:.4f} ms "
              f"({view['calls']} calls)", flush=True)
        live = live_metrics_latency(tmp / "live-home", args.steps)
        live_ratio = live["p99_ms"] / raw_read["p99_ms"]
        met = max(view["p99_ms"], live["p99_ms"]) <= TARGET_METRICS_P99_MS
        print(f"   live job (new rows every ms), the {live['calls_with_new_rows']} calls of {live['calls']} "
              f"that found new rows: p50 {live['p50_ms']:.1f} ms, p99 {live['p99_ms']:.1f} ms, "
              f"max {live['max_ms']:.1f} ms; "
              f"p99 ratio to baseline {live_ratio:.3f}; target p99 <= {TARGET_METRICS_P99_MS} ms: "
              f"{'met' if met else 'MISSED'}", flush=True)
        out["metrics_latency"] = {**lat, "live": live, "p99_ratio": live_ratio, "target_p99_ms": TARGET_METRICS_P99_MS,
                                  "met": met}

        if not args.skip_rss:
            print(f"2. parent RSS during a real job (tiny model, {args.rss_steps} LoRA steps)", flush=True)
            bare = bare_import_rss()
            print(f"   baseline (bare import tunestudio.jobs.manager): {bare:.1f} MB", flush=True)
            rss = parent_rss(tmp, args.rss_steps, args.model)
            rss_ratio = rss["peak_mb"] / bare
            print(f"   parent peak RSS {rss['peak_mb']:.1f} MB (median {rss['median_mb']:.1f}, "
                  f"{rss['samples']} samples "
                  f"over {rss['job_seconds']:.1f} s, job {rss.get('status')} at step {rss.get('last_step')}, "
                  f"heavy modules in parent: {rss.get('heavy_loaded')}); ratio to baseline {rss_ratio:.2f}; "
                  f"target <= {TARGET_RSS_MB} MB: {'met' if rss['peak_mb'] <= TARGET_RSS_MB else 'MISSED'}",
                  flush=True)
            out["rss"] = {"baseline_mb": bare, **rss, "ratio": rss_ratio, "target_mb": TARGET_RSS_MB,
                          "met": rss["peak_mb"] <= TARGET_RSS_MB}

    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
