"""What a job's processes use over time: a background thread of the worker samples it and sends `Resources`.

The processes are the worker and its children (a converter, data loader workers; under torchrun rank 0 watches
the launcher and every local rank). CPU is the sum of their utilisation since the last sample (100 = one core),
memory the sum of their resident sets. With CUDA in use: the GPU's utilisation and the memory the processes
hold on it (NVML when it is installed and sees them, else torch's reserved memory of this process).

The first samples come sooner (0.5 s, then 1 s later, then every `interval`), so a job of a few seconds shows
its course too. The volume stays bounded: a sample every `interval` seconds, and the interval doubles after
every `double_after` samples, so a job of duration T sends about double_after · log2(T / (double_after ·
interval)) events, a few thousand even for days. Nothing here may fail a job: a sample that raises is skipped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from typing import Any

import psutil

from tunestudio.events import Resources

log = logging.getLogger(__name__)

INTERVAL_S = 2.0
FIRST_S = 0.5  # the first sample comes this soon, the next ones twice as late until INTERVAL_S: a short job's too
DOUBLE_AFTER = 500


class Sampler:
    """Samples the process tree under `root_pid` (default: this process); `start()` sends through `channel`."""

    def __init__(self, channel: Any, root_pid: int | None = None, interval: float = INTERVAL_S,
                 double_after: int = DOUBLE_AFTER) -> None:
        self.channel = channel
        self.root_pid = root_pid or os.getpid()
        self.interval = interval
        self.double_after = double_after
        self._known: dict[int, psutil.Process] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="resources", daemon=True)

    def start(self) -> Sampler:
        self.sample()  # primes each process's CPU counter: the first real figure comes one interval later
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        interval, sent = min(FIRST_S, self.interval), 0
        while not self._stop.wait(interval):
            if sent < self.double_after:
                interval = min(interval * 2, self.interval)  # 0.5, 1, 2, 2, ... s: a short job shows its course
            try:
                figures = self.sample()
                if figures is not None:
                    self.channel.emit(Resources, **figures)
                    sent += 1
            except Exception:  # a sample is never worth a job
                log.debug("resource sample failed", exc_info=True)
                continue
            if sent and sent % self.double_after == 0:
                interval *= 2

    def _tree(self) -> list[psutil.Process]:
        try:
            root = self._known.get(self.root_pid) or psutil.Process(self.root_pid)
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []

    def sample(self) -> dict[str, Any] | None:
        """The figures now, or None when the root process is gone."""
        tree = self._tree()
        if not tree:
            return None
        cpu = rss = 0.0
        alive: dict[int, psutil.Process] = {}
        for proc in tree:
            known = self._known.get(proc.pid, proc)
            try:
                with known.oneshot():
                    # A process seen for the first time answers 0.0 (no interval yet) and counts from now.
                    cpu += known.cpu_percent(None)
                    rss += known.memory_info().rss
            except psutil.Error:
                continue
            alive[known.pid] = known
        self._known = alive
        if not alive:
            return None
        figures: dict[str, Any] = {"cpu_percent": round(cpu, 1), "rss_mb": round(rss / 2**20, 1),
                                   "processes": len(alive)}
        figures.update(gpu_figures(set(alive)))
        return figures


def gpu_figures(pids: set[int]) -> dict[str, float]:
    """gpu_percent and gpu_memory_mb of these processes, when this process uses CUDA already; else {}.

    torch is never imported nor CUDA initialised here: a job that does not use the GPU has no GPU figures.
    """
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return {}
        devices = range(torch.cuda.device_count())
        memory = _nvml_memory(pids, devices)
        if memory is None:
            memory = sum(torch.cuda.memory_reserved(d) for d in devices) / 2**20
        out = {"gpu_memory_mb": round(memory, 1)}
        with contextlib.suppress(Exception):  # utilization() needs NVML (pynvml); memory alone is still worth a line
            out["gpu_percent"] = float(max(torch.cuda.utilization(d) for d in devices))
        return out
    except Exception:
        log.debug("GPU figures failed", exc_info=True)
        return {}


def _nvml_memory(pids: set[int], devices: range) -> float | None:
    """MiB of GPU memory NVML sees these processes hold, or None when NVML is missing or sees none of them."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        used = 0
        for device in devices:
            handle = pynvml.nvmlDeviceGetHandleByIndex(device)
            used += sum(p.usedGpuMemory or 0 for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
                        if p.pid in pids)
    except Exception:
        return None
    return used / 2**20 if used else None
