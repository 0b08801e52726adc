"""Errors the user can act on, and telling them from bugs.

A `UserError` is reported as `Failed` with its message alone; a `UserFacing`
error is a chat request's answer (an `Error` reply). Running out of
memory (`out_of_memory`) and a full disk (`disk_full`) are found through an
error's `__cause__`/`__context__` (`causes`: torch and safetensors wrap the
errors that tell) and reported as what to change. Anything else is a bug and
carries its traceback for the logs.

Stdlib only: torch is consulted only if the process already imported it.
"""

from __future__ import annotations

import errno
import re
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tunestudio.config import JobConfig

__all__ = ["UserError", "UserFacing", "causes", "decided", "disk_full", "memory_advice", "out_of_memory"]


class UserError(Exception):
    """Something in the job's input (model, data, config) that the user must fix."""


class UserFacing(Exception):
    """A chat request the inference worker cannot answer, for a reason its sender can act on: an `Error` reply
    with this message, HTTP status and code (worker/serve/inference.py), never a traceback."""

    def __init__(self, message: str, status: int = 400, code: str = "invalid_request", **extra: Any) -> None:
        super().__init__(message)
        self.status, self.code, self.extra = status, code, extra


def causes(exc: BaseException | None, depth: int = 5) -> Iterator[BaseException]:
    """An error and what caused it, nearest first (torch and safetensors wrap the errors that tell)."""
    while exc is not None and depth > 0:
        yield exc
        exc, depth = exc.__cause__ or exc.__context__, depth - 1


def disk_full(exc: BaseException | None) -> bool:
    """Whether an error (or what caused it) is a full disk."""
    return any((isinstance(e, OSError) and e.errno == errno.ENOSPC) or "No space left on device" in str(e)
               or "file write failed" in str(e)  # torch's writer (inline_container.cc) on a full disk
               for e in causes(exc))


def out_of_memory(exc: BaseException | None, cfg: JobConfig, peak_mb: float | None = None) -> str | None:
    """What to change when an error (or what caused it) is running out of memory, else None.

    GPU: torch's OutOfMemoryError, or a message from the device allocator ("CUDA out of memory",
    "CUDA error: out of memory") or a CUDA library's (cuBLAS's "CUBLAS_STATUS_ALLOC_FAILED").
    CPU: MemoryError, or torch's "DefaultCPUAllocator: can't allocate memory".
    Pure: torch is consulted only if this process already imported it (no error of torch's otherwise).
    """
    torch = sys.modules.get("torch")
    gpu_error = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    where, text = None, ""
    for cause in causes(exc):
        text = str(cause)
        if isinstance(cause, MemoryError) or "can't allocate memory" in text:
            where = "memory"
        elif ((gpu_error is not None and isinstance(cause, gpu_error)) or "out of memory" in text.lower()
              or "_STATUS_ALLOC_FAILED" in text):
            where = "GPU memory"
        if where is not None:
            break
    if where is None:
        return None
    facts = []
    asked = re.search(r"[Tt]ried to allocate (\d+(?:\.\d+)? ?[KMGT]i?B)", text)
    if asked:
        capacity = re.search(r"total capacity of (\d+(?:\.\d+)? ?[KMGT]i?B)", text)
        facts.append(f"an allocation of {asked.group(1)} failed" + (f" on a GPU of {capacity.group(1)}"
                                                                    if capacity else ""))
    if peak_mb:
        facts.append(f"the job's peak was {peak_mb:,.0f} MiB")
    advice = memory_advice(cfg)
    remedy = ("To fit, try: " + "; ".join(advice) if advice else
              "The job already has the settings that save the most memory: it needs a smaller model or more memory")
    return f"out of {where}: " + (f"{'; '.join(facts)}. " if facts else "") + remedy + "."


# What this worker decided for settings left to it ("auto"), for the advice of an out-of-memory failure;
# worker/main.py records them as it decides.
decided: dict[str, Any] = {}


def memory_advice(cfg: JobConfig) -> list[str]:
    """The config changes that need less memory, for this job (none it already has)."""
    advice = []
    batch, accumulation = cfg.batch_size, cfg.gradient_accumulation_steps
    if batch > 1:
        smaller = max(d for d in range(1, batch // 2 + 1) if batch % d == 0)  # keeps the global batch exact
        advice.append(f"a smaller batch_size ({smaller}) with gradient_accumulation_steps "
                      f"{accumulation * batch // smaller}, which keeps the global batch of {batch * accumulation}")
    if cfg.max_seq_length >= 16:
        advice.append(f"a shorter max_seq_length ({cfg.max_seq_length // 2})")
    if cfg.gradient_checkpointing not in (True, "unsloth") and not decided.get("gradient_checkpointing"):
        advice.append("gradient_checkpointing: true (activations recomputed: slower, far less memory)")
    if cfg.training_type.value == "full":
        advice.append("training_type: qlora (4-bit base weights and small adapters; or lora, full-size weights)")
    elif cfg.training_type.value == "lora":
        advice.append("training_type: qlora (4-bit base weights)")
    return advice
