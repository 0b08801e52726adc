"""The estimate before Start: parameters, trainable parameters, memory, whether it fits, a time per step.

The memory is tunestudio/estimate.py's, the model the worker's `gradient_checkpointing:
auto` decides on (arithmetic on config.json, never a loaded model: the parent does not
import torch), so the page says what the worker will do. This module adds the page's
view: the device and its free memory, whether the job fits, and a time per step, from
what an earlier job measured on this machine when there is one, else from FLOP
arithmetic. It is an estimate; the page says so.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from tunestudio.estimate import RUNTIME_BYTES, EstimateUnavailable, Memory, checkpointing_needed, job_memory

__all__ = ["Estimate", "EstimateUnavailable", "estimate", "measured_step"]

# Effective training speed, FLOP/s: a fraction of peak that small jobs reach (tunestudio measured ~6,300
# tok/s on the 755k tiny model on 2 cores: about 30 GFLOP/s). A GPU: an assumed 30 TFLOP/s.
CPU_FLOPS_PER_CORE = 15e9
GPU_FLOPS = 30e12


@dataclass
class Estimate:
    parameters: int
    parameters_source: str
    trainable: int
    weights_bytes: int
    adapter_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    total_bytes: int
    available_bytes: int | None
    device: str
    fits: bool | None
    seconds_per_step: float | None
    tokens_per_step: int
    notes: list[str]
    seconds_source: str = "arithmetic"  # or "calibration": measured by an earlier job on this machine

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def estimate(config: dict[str, Any], job: dict[str, Any], machine: dict[str, Any],
             exact_parameters: int | None = None, calibrations: dict[str, Any] | None = None) -> Estimate:
    """config: the model's config.json; job: JobConfig fields (training_type, method, batch_size,
    max_seq_length, gradient_accumulation_steps, lora_r, target_modules, finetune_*_modules,
    gradient_checkpointing, precision, optim, and model_name); machine: api.hardware.hardware(); calibrations:
    the worker's measured precision decisions (`TUNESTUDIO_HOME/cache/precision.json`, see `measured_step`).
    Raises EstimateUnavailable when config.json lacks the model's shape."""
    training_type = str(job["training_type"])
    gpus = machine.get("gpus") or []
    on_gpu = bool(gpus)
    notes: list[str] = []
    # auto: a CPU starts from fp32 and a GPU from bf16/fp16 (worker/train.py); the activations are sized so
    precision = str(job["precision"])
    compute = precision if precision != "auto" else ("bf16" if on_gpu else "fp32")

    def needs(checkpointing: bool) -> Memory:
        return job_memory(config, job, precision=compute, checkpointing=checkpointing, parameters=exact_parameters)

    if on_gpu:
        gpu = max(gpus, key=lambda g: g.get("memory_total_mb") or 0)
        available = int((gpu.get("memory_total_mb") or 0) * 2**20) or None
        device = f"GPU {gpu.get('name', '')}".strip()
    else:
        available = int(((machine.get("memory") or {}).get("available_mb") or 0) * 2**20) or None
        device = "CPU (available memory)"
    plain = needs(False)
    checkpointing = job.get("gradient_checkpointing")
    if checkpointing == "auto":
        # worker/memory.py's rule on the same figures: on only if the job would not fit without it, in what is
        # free once the weights are loaded
        free = None if available is None else available - plain.weights_bytes - RUNTIME_BYTES
        checkpointing = free is not None and checkpointing_needed(plain, free)
        notes.append("activation checkpointing auto: " + ("on, the job would not fit without it" if checkpointing
                                                          else "off, the job fits without it"))
    elif checkpointing:
        notes.append("activation checkpointing: less memory, slower steps")
    chosen = needs(True) if checkpointing else plain
    total = chosen.total_bytes + RUNTIME_BYTES
    fits = None if available is None else total <= available
    if training_type == "qlora" and not on_gpu:
        notes.append("QLoRA trains on a CPU here (bitsandbytes), slowly")

    # --- a rough time per step: 6·N·tokens FLOPs for a full fine-tune, ~4·N·tokens with a frozen base --------
    accumulation = int(job["gradient_accumulation_steps"])
    step_tokens = int(job["batch_size"]) * int(job["max_seq_length"]) * accumulation
    flops = (6 if training_type == "full" else 4) * chosen.parameters * step_tokens
    cores = (machine.get("cpu") or {}).get("physical_cores") or (machine.get("cpu") or {}).get("logical_cores") or 1
    speed = GPU_FLOPS if on_gpu else CPU_FLOPS_PER_CORE * cores
    seconds, source = flops / speed, "arithmetic"
    measured = measured_step(calibrations or {}, job)
    if measured is not None:
        seconds, source = measured[0] * accumulation, "calibration"
        notes.append(measured[1])
    return Estimate(
        parameters=chosen.parameters, parameters_source="safetensors headers" if exact_parameters else "config.json",
        trainable=chosen.trainable, weights_bytes=chosen.weights_bytes, adapter_bytes=chosen.adapter_bytes,
        gradients_bytes=chosen.gradients_bytes, optimizer_bytes=chosen.optimizer_bytes,
        activations_bytes=chosen.activations_bytes, total_bytes=total, available_bytes=available, device=device,
        fits=fits, seconds_per_step=seconds, tokens_per_step=step_tokens, notes=notes, seconds_source=source,
    )


def measured_step(calibrations: dict[str, Any], job: dict[str, Any]) -> tuple[float, str] | None:
    """Seconds per micro-batch for this job from what `precision: auto` measured on this machine (forward and
    backward of one batch, worker/calibrate.py) for the same model, method and training type: the timing of the
    job's fixed precision if it was measured, else of the precision auto chose; from the measurement nearest in
    batch × length, scaled to this job's. None when no job has measured one."""
    wanted = job.get("batch_size", 0) * job.get("max_seq_length", 0)
    if not wanted:
        return None
    best: tuple[float, float, str] | None = None
    for entry in calibrations.values():
        about = entry.get("job") if isinstance(entry, dict) else None
        if not isinstance(about, dict) or any(
                str(about.get(k)) != str(job.get(k)) for k in ("model_name", "method", "training_type")):
            continue
        timings = entry.get("seconds_per_step") or {}
        precision = job.get("precision") if job.get("precision") in timings else entry.get("precision")
        seconds = timings.get(precision) if isinstance(timings, dict) else None
        size = (about.get("batch_size") or 0) * (about.get("max_seq_length") or 0)
        if not isinstance(seconds, (int, float)) or seconds <= 0 or not isinstance(size, int) or size <= 0:
            continue
        distance = abs(math.log(wanted / size))
        if best is None or distance < best[0]:
            scaled = seconds * wanted / size
            note = (f"time per step measured by an earlier job on this machine: {seconds * 1000:.0f} ms for a batch of "
                    f"{about['batch_size']} × {about['max_seq_length']} tokens in {precision}, forward and backward"
                    + ("" if size == wanted else ", scaled to this batch"))
            best = (distance, scaled, note)
    return None if best is None else (best[1], best[2])
