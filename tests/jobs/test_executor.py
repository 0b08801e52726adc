"""The local executor: a worker process of its own group, commands in, events out, killed as a group."""

from __future__ import annotations

import signal

from tunestudio.events import Stop, parse_event
from tunestudio.jobs.executor import LocalExecutor
from tunestudio.process import pid_alive

from ..helpers import fake_workers
from ..helpers.wait import wait_until


def test_local_executor_runs_talks_and_kills() -> None:
    executor = LocalExecutor(fake_workers.ignores_stop, prewarm=False)
    executor.start({"output_dir": None}, {}, None)
    assert executor.alive() and executor.pid
    first = wait_until(lambda: executor.next_item(timeout=0.5), 30, "the worker's first event")
    assert parse_event(first).kind == "phase"
    executor.send(Stop(save=True))  # ignored by this worker; delivering it must not fail
    assert executor.exitcode() is None
    executor.kill(signal.SIGKILL)
    executor.join(timeout=10)
    assert executor.exitcode() == -signal.SIGKILL and not executor.alive()
    assert not pid_alive(executor.pid)
    executor.send(Stop(save=False))  # gone: still no error
    executor.kill(signal.SIGKILL)
