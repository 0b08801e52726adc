"""`gradient_checkpointing: auto`: on only when the job would not fit in free memory without it.

Activation checkpointing recomputes each layer in backward: on a CPU it made a
LoRA job on a 270M model 3.5x slower and bought nothing when memory was
plentiful (FACTS.md). So `auto` asks tunestudio/estimate.py what the job needs
beyond the weights already loaded (gradients, optimizer state, the activations
of one micro-batch) and turns checkpointing on only when that would not fit in
HEADROOM (estimate.py) of the memory free now: the GPU's free memory, or the machine's
available memory shared by the ranks on it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunestudio.estimate import Memory, checkpointing_needed, job_memory

GIB = 2**30


@dataclass(frozen=True)
class Choice:
    on: bool
    note: str


def available_bytes() -> int | None:
    """Memory free for this process now: the GPU's free memory, else MemAvailable over the ranks on this machine."""
    import torch

    if torch.cuda.is_available():
        return int(torch.cuda.mem_get_info()[0])
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                ranks_here = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
                return int(line.split()[1]) * 1024 // ranks_here
    except (OSError, ValueError, IndexError):
        pass
    return None


def needs(cfg: Any, model_config: dict[str, Any], precision: str, checkpointing: bool) -> Memory:
    """The job's memory by tunestudio/estimate.py, the model the page's estimate uses too."""
    return job_memory(model_config, cfg.model_dump(mode="json"), precision=precision, checkpointing=checkpointing)


def decide(cfg: Any, model_config: dict[str, Any], precision: str, free: int | None) -> Choice:
    """Checkpointing for a job with `gradient_checkpointing: auto`, and why."""
    if free is None:
        return Choice(False, "activation checkpointing auto → off (free memory unknown)")
    try:
        plain = needs(cfg, model_config, precision, checkpointing=False)
        checkpointed = needs(cfg, model_config, precision, checkpointing=True)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):  # EstimateUnavailable is a ValueError
        return Choice(False, "activation checkpointing auto → off (the model's shape is unknown to the estimate)")
    without, with_it = plain.beyond_weights, checkpointed.beyond_weights
    if not checkpointing_needed(plain, free):
        return Choice(False, f"activation checkpointing auto → off (the job needs about {without / GIB:.1f} GiB "
                             f"beyond its weights; {free / GIB:.1f} GiB free)")
    note = (f"activation checkpointing auto → on (without it the job needs about {without / GIB:.1f} GiB beyond its "
            f"weights, with it {with_it / GIB:.1f} GiB; {free / GIB:.1f} GiB free)")
    if checkpointing_needed(checkpointed, free):
        note += "; it may still not fit: a smaller batch_size or max_seq_length, or QLoRA, would help"
    return Choice(True, note)
