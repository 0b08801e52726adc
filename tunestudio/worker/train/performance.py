"""CPU speed choices: bf16 autocast where it pays, and thread counts that use every core once.

The bf16 rule, measured here: on CPUs with native bf16 matrix units (AMX or
AVX512-BF16) a 2048² matmul runs 5-7x faster in bf16 than in fp32, but
autocast adds a cast per op, and for narrow models the casts dominate:
- hidden 128 (a 755k-parameter Llama, FACTS.md): bf16 autocast ~40% slower;
- hidden 512 (a 26.7M Llama, seq 256, bench/throughput.py, 2026-12-02):
  bf16 2.9x the tokens/s of fp32, step losses within 0.01%.
Hidden sizes in between are unmeasured, so they stay fp32. `precision: auto`
takes bf16 when the CPU has the units and hidden_size >= BF16_MIN_HIDDEN.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from tunestudio.process import torch_threads

# The smallest hidden size at which bf16 autocast beat fp32 in bench/throughput.py.
BF16_MIN_HIDDEN = 512


def cpu_has_bf16_matmul() -> bool:
    """AMX or AVX512-BF16, from the kernel's CPU flags (torch has no public probe)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            return bool({"amx_bf16", "avx512_bf16"} & flags)
    return False


def cpu_prefers_bf16(hidden_size: int | None) -> bool:
    return hidden_size is not None and hidden_size >= BF16_MIN_HIDDEN and cpu_has_bf16_matmul()


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def peak_memory_mb() -> float:
    """The process's peak memory so far: allocated CUDA memory on a GPU, else the peak resident set size."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def configure_threads() -> int:
    """One torch thread per available core (per rank's share of them); tokenizers stay single-threaded.

    The training loop is the one parallel consumer: tokenization happens before it,
    and the DataLoader runs in-process (dataloader_num_workers=0), so nothing else
    competes for the cores while it runs. Under torchrun, the LOCAL_WORLD_SIZE ranks
    on this machine split the cores, so N ranks do not oversubscribe them.
    """
    ranks_here = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    cores = torch_threads(max(1, available_cores() // ranks_here))
    if torch.get_num_threads() != cores:
        # Only when torch's own default differs (e.g. a CPU quota): resetting the pool to the
        # same size was measured slower in a spawned worker (bench/worker_overhead.py diagnosis).
        torch.set_num_threads(cores)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    return cores
