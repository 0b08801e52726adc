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

import contextlib
import ctypes
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


# glibc's mallopt parameters (malloc.h) and the values the training process sets.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20  # glibc's own ceiling for its dynamic threshold (DEFAULT_MMAP_THRESHOLD_MAX, 64-bit)
TRIM_THRESHOLD = 1 << 30


def configure_allocator() -> bool:
    """Keep freed tensor memory in the process instead of handing it back to the kernel at every step.

    glibc adjusts its thresholds as blocks come and go: a block above the mmap threshold is mapped and unmapped
    each time, and free memory at the top of the heap above the trim threshold is returned. A training step frees
    and allocates the same activations every time, so memory returned after one step is faulted back in, zeroed,
    during the next. Measured here (a LoRA step of the tiny SmolVLM, 1 thread): 224 minor page faults a step and
    34.8 ms; after one bf16 autocast step (precision auto's measurement) moved the dynamic thresholds, 2,882 faults
    and 41.1 ms for the rest of the job; with the thresholds fixed at 32 MiB and 1 GiB, no faults in the steady
    state and 34.9 ms, bf16 step or not. The thresholds apply to this process only (a worker), and not where the
    user chose for themselves (MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_, or another allocator preloaded).
    Returns whether they were set."""
    if any(k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")) or \
            ("LD_PRELOAD" in os.environ and "malloc" in os.environ["LD_PRELOAD"]):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        # both at once: setting either one turns glibc's dynamic adjustment off, so the other must be set too
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
            libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    except (OSError, AttributeError):  # not glibc (musl, macOS): its allocator as it is
        return False


def release_free_memory() -> None:
    """Hand the allocator's free memory back to the kernel (glibc's malloc_trim): a thread's malloc arena outlives
    the thread, and a 256M model's measuring steps left 2.2 GiB there beside the training's (bench/vision_train.py,
    peak RSS 4.9 -> 7.1 GiB)."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to do
        ctypes.CDLL("libc.so.6").malloc_trim(0)


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
