"""worker/ray/job.py's output (the job's log): the lines Ray's driver prints for its processes, as text. No
cluster: Ray's own printer and deduplication note, into the driver's stream."""

from __future__ import annotations

import io

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
