"""worker/ray/job.py's output (the job's log): the lines Ray's driver prints for its processes, as text. No
cluster: Ray's own printer and deduplication note, into the driver's stream."""

from __future__ import annotations

import io
import threading

import pytest

from tunestudio.worker.ray.job import PlainText


def test_rays_lines_reach_the_log_without_terminal_colour_codes(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray", reason="ray is an optional extra: pip install -e '.[ray]'")
    from ray._private.ray_logging import _color
    from ray._private.worker import print_worker_logs

    monkeypatch.delenv("RAY_COLOR_PREFIX", raising=False)  # coloured prefixes, as Ray prints them by default
    log = io.StringIO()
    batch = {"pid": "1001", "ip": "127.0.0.1", "localhost": "127.0.0.1", "actor_name": "RayTrainWorker",
             "lines": ["Setting up process group", "step 3" + _color(" [repeated 2x across cluster]")]}
    coloured = io.StringIO()
    print_worker_logs(batch, coloured)
    assert "\x1b[" in coloured.getvalue()  # what the job's log held before
    print_worker_logs(batch, PlainText(log))
    assert log.getvalue() == ("(RayTrainWorker pid=1001) Setting up process group\n"
                              "(RayTrainWorker pid=1001) step 3 [repeated 2x across cluster]\n")


def test_without_a_dashboard_the_blind_cleaners_warning_is_left_out_and_the_rest_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("ray", reason="ray is an optional extra: pip install -e '.[ray]'")
    from ray._private.worker import print_worker_logs

    from tunestudio.worker.ray.job import BLIND_CLEANER

    monkeypatch.delenv("RAY_COLOR_PREFIX", raising=False)
    warning = ("Failed to query Ray Train Controller actor state. State API may be temporarily unavailable. "
               "Continuing to monitor.")  # Ray Train's own words (placement_group_cleaner.py)
    cleaner = {"pid": "396", "ip": "127.0.0.1", "localhost": "127.0.0.1", "actor_name": "PlacementGroupCleaner",
               "lines": [warning, "Detected that the Ray Train controller actor (a1) is dead."]}
    worker = {"pid": "1001", "ip": "127.0.0.1", "localhost": "127.0.0.1", "actor_name": "RayTrainWorker",
              "lines": ["step 3", warning]}  # the same words from another process: not the blind cleaner's
    log = io.StringIO()
    stream = PlainText(log)
    print_worker_logs(cleaner, stream)  # before the driver knows: kept
    stream.drop = BLIND_CLEANER
    for batch in (cleaner, worker, cleaner):
        print_worker_logs(batch, stream)
    # Ray's log thread has written a cleaner's line but not its end when the driver's own line comes: each
    # thread's line stays whole, and only the cleaner's is left out.
    written, go_on = threading.Event(), threading.Event()

    def log_thread() -> None:
        stream.write(f"(PlacementGroupCleaner pid=396) {warning}")
        written.set()
        go_on.wait(30)
        stream.write("\n")

    other = threading.Thread(target=log_thread)
    other.start()
    written.wait(30)
    stream.write("06:00:00 [warning] ray: the driver's own line\n")
    go_on.set()
    other.join(30)
    stream.write("a partial")
    stream.flush()  # a line's text is held until its end, and written out by a flush
    assert log.getvalue().splitlines() == [
        f"(PlacementGroupCleaner pid=396) {warning}",
        "(PlacementGroupCleaner pid=396) Detected that the Ray Train controller actor (a1) is dead.",
        "(PlacementGroupCleaner pid=396) Detected that the Ray Train controller actor (a1) is dead.",
        "(RayTrainWorker pid=1001) step 3",
        f"(RayTrainWorker pid=1001) {warning}",
        "(PlacementGroupCleaner pid=396) Detected that the Ray Train controller actor (a1) is dead.",
        "06:00:00 [warning] ray: the driver's own line",
        "a partial",
    ]


def test_sigterm_has_ray_trains_handler_abort_the_run_for_a_bounded_time_then_exits_with_15(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import signal
    import time

    from tunestudio.worker.ray import job

    calls: list[int] = []
    release = threading.Event()

    def ray_trains(signum: int, frame: object) -> None:  # stands for the handler `fit` installs: it waits
        calls.append(signum)
        release.wait(30)

    monkeypatch.setattr(job, "_terminated", threading.Event())
    monkeypatch.setattr(job, "ABORT_S", 0.2)
    monkeypatch.setattr(job.signal, "getsignal", lambda sig: ray_trains if sig == signal.SIGINT else None)
    start = time.monotonic()
    with pytest.raises(SystemExit) as ended:
        job._terminate(signal.SIGTERM, None)
    assert ended.value.code == signal.SIGTERM and calls == [signal.SIGINT]
    assert time.monotonic() - start < 10  # the abort's wait is bounded (ABORT_S), not the handler's
    job._terminate(signal.SIGTERM, None)  # a second SIGTERM: nothing more (the first one's exit goes on)
    assert calls == [signal.SIGINT]
    release.set()

    # Before `fit` (no handler of Ray Train's yet): straight to the exit, through the callers' `finally`s.
    monkeypatch.setattr(job, "_terminated", threading.Event())
    monkeypatch.setattr(job.signal, "getsignal", lambda sig: signal.default_int_handler)
    with pytest.raises(SystemExit):
        job._terminate(signal.SIGTERM, None)
    assert calls == [signal.SIGINT]
