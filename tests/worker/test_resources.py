"""The worker's resource sampler (worker/resources.py): its process tree, its bounded rate, GPU figures only when
the worker uses CUDA."""

from __future__ import annotations

import itertools
import subprocess
import sys
import types
from typing import Any

import pytest

from tests.helpers.wait import wait_until
from tunestudio.events import Resources, parse_event
from tunestudio.worker import resources
from tunestudio.worker.resources import Sampler

pytestmark = pytest.mark.timeout(60)


class Recorder:
    """A channel that keeps what it is sent, as the parent would read it."""

    def __init__(self) -> None:
        self.events: list[Resources] = []

    def emit(self, cls: type, **fields: Any) -> Any:
        event = cls(seq=len(self.events) + 1, **fields)
        parsed = parse_event(event.model_dump_json())  # what crosses to the parent is a valid event
        assert isinstance(parsed, Resources)
        self.events.append(parsed)
        return event


def test_it_samples_the_worker_and_its_busy_child_and_slows_down_by_itself() -> None:
    channel = Recorder()
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    sampler = Sampler(channel, interval=0.2, double_after=3).start()
    try:
        wait_until(lambda: len(channel.events) >= 5, 30, "five samples")
    finally:
        sampler.stop()
        busy.kill()
        busy.wait()
    events = channel.events
    assert all(e.processes >= 2 for e in events), [e.processes for e in events]  # this process and its child
    assert max(e.cpu_percent for e in events) > 30  # the child spins a core
    assert all(e.rss_mb > 5 for e in events)
    assert all(e.gpu_percent is None and e.gpu_memory_mb is None for e in events)  # no CUDA here
    gaps = [b.ts - a.ts for a, b in itertools.pairwise(events)]
    assert gaps[-1] > 1.5 * 0.2  # after 3 samples the interval doubled
    count = len(events)
    assert not sampler._thread.is_alive() and len(channel.events) == count  # stopped: it sends nothing more


def test_gpu_figures_only_when_this_process_uses_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert resources.gpu_figures({1}) == {}  # torch not loaded: never imported for a sample

    def fake_torch(initialized: bool) -> types.ModuleType:
        cuda = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: initialized,
                                     device_count=lambda: 2, memory_reserved=lambda d: (d + 1) * 2**30,
                                     utilization=lambda d: [30, 70][d])
        return types.SimpleNamespace(cuda=cuda)  # type: ignore[return-value]

    monkeypatch.setitem(sys.modules, "torch", fake_torch(initialized=False))
    assert resources.gpu_figures({1}) == {}  # CUDA available but unused by the job: no GPU line
    monkeypatch.setitem(sys.modules, "torch", fake_torch(initialized=True))
    assert resources.gpu_figures({1}) == {"gpu_memory_mb": 3072.0, "gpu_percent": 70.0}
