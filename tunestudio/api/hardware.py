"""What this machine has, without importing torch: CPU, memory, GPUs (nvidia-smi, else NVML)."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any

import psutil


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _gpus_nvidia_smi() -> list[dict[str, Any]] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    query = "index,name,memory.total,memory.used,utilization.gpu,driver_version"
    try:
        out = subprocess.run([exe, f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=5, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    gpus = []
    for line in out.strip().splitlines():
        idx, name, total, used, util, driver = [p.strip() for p in line.split(",")]
        gpus.append({"index": int(idx), "name": name, "memory_total_mb": float(total), "memory_used_mb": float(used),
                     "utilization_percent": float(util) if util.replace(".", "").isdigit() else None,
                     "driver": driver, "source": "nvidia-smi"})
    return gpus


def _gpus_nvml() -> list[dict[str, Any]] | None:
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            gpus.append({"index": i, "name": name.decode() if isinstance(name, bytes) else name,
                         "memory_total_mb": memory.total / 2**20, "memory_used_mb": memory.used / 2**20,
                         "utilization_percent": None, "driver": None, "source": "nvml"})
        return gpus
    except Exception:
        return None


def hardware() -> dict[str, Any]:
    memory = psutil.virtual_memory()
    flags = _cpu_flags()
    gpus = _gpus_nvidia_smi()
    if gpus is None:
        gpus = _gpus_nvml() or []
    return {
        "cpu": {
            "name": _cpu_name(),
            "logical_cores": os.cpu_count(),
            "physical_cores": psutil.cpu_count(logical=False),
            "bf16_matmul": bool({"amx_bf16", "avx512_bf16"} & flags),
            # Live: the use since the previous call (the page polls; the first call after start-up reads 0).
            "percent": psutil.cpu_percent(interval=None),
        },
        "memory": {"total_mb": memory.total / 2**20, "available_mb": memory.available / 2**20,
                   "used_mb": (memory.total - memory.available) / 2**20, "percent": memory.percent},
        "gpus": gpus,
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
