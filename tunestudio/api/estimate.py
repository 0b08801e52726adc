"""The estimate before Start: parameters, memory, whether it fits, the time a step and the time to finish.

The memory is tunestudio/estimate.py's, the model the worker's `gradient_checkpointing:
auto` decides on (arithmetic on config.json, never a loaded model: the parent does not
import torch), so the page says what the worker will do. This module adds the page's
view: the device and its free memory, whether the job fits, and time:

- tokens a step: batch x accumulation x the tokens a row really has (the dataset
  report's mean, cut at max_seq_length) when the page knows it, else max_seq_length;
- a speed measured on this machine, in this order: earlier finished jobs of the same
  model, training type and method (their tokens per second); the precision
  calibration of an earlier job (worker/train/calibrate.py); earlier jobs of other models,
  as effective FLOP/s scaled by FLOPs per token (estimate.flops_per_token); only
  when nothing ran here yet, FLOP arithmetic at an assumed speed;
- the total: training, the evaluations (forward passes over the held-out rows),
  the generated answers before and after, and loading and saving, each with what
  it is based on (`basis`). It is an estimate; the page says so, and the job page
  shows it against the step time the job measures.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from tunestudio.estimate import (
    RUNTIME_BYTES,
    EstimateUnavailable,
    Memory,
    checkpointing_needed,
    flops_per_token,
    job_memory,
)

__all__ = ["Estimate", "EstimateUnavailable", "Measured", "estimate", "measured_step"]

# Effective training speed when nothing ran on this machine yet, FLOP/s: bench/realistic.py measured a LoRA step
# of a SmolLM-shaped 135M model at ~53 GFLOP/s on one thread of this kind of CPU in fp32; two threads do not
# double it. A GPU: an assumed 30 TFLOP/s.
CPU_FLOPS_PER_CORE = 35e9
GPU_FLOPS = 30e12
# Generating one token costs far more than its FLOPs on a CPU (one token at a time, Python between tokens):
# bench/inference.py measured 7 tokens/s on a 270M model whose training ran at ~100 GFLOP/s effective.
DECODE_SLOWDOWN = 25.0
DECODE_OVERHEAD_S = 0.01
LOAD_BYTES_PER_SECOND = 400e6  # reading safetensors and building the model, plus ~3 s of libraries
MEASURED_JOBS = 3  # the latest finished jobs of the same model whose speed is averaged (median)


@dataclass(frozen=True)
class Measured:
    """A finished training job on this machine: its speed, and the time it spent beside training."""

    job_id: str
    model_name: str
    training_type: str
    method: str
    tokens_per_second: float
    flops_per_token: float | None  # its model's, for a speed in FLOP/s (None: its config.json is gone)
    seconds_beyond_training: float | None = None  # wall time less training: loading, evaluations, answers, saving


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
    seconds_source: str = "arithmetic"  # "measured" (earlier jobs of this model), "calibration", "scaled", "arithmetic"
    tokens_per_row: float | None = None  # the rows' mean tokens (cut at max_seq_length) when the request knew them
    steps: int | None = None  # optimizer steps to finish (None: the dataset's rows are unknown)
    train_seconds: float | None = None
    evaluation_seconds: float | None = None  # evaluations during training and the final one
    generation_seconds: float | None = None  # answers generated before and after training
    other_seconds: float | None = None  # loading the model and data, saving
    total_seconds: float | None = None
    basis: list[str] = field(default_factory=list)  # what each figure rests on, one line each

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def estimate(config: dict[str, Any], job: dict[str, Any], machine: dict[str, Any],
             exact_parameters: int | None = None, calibrations: dict[str, Any] | None = None,
             measured: Sequence[Measured] = (), dataset: dict[str, Any] | None = None) -> Estimate:
    """config: the model's config.json; job: JobConfig fields (training_type, method, batch_size,
    max_seq_length, gradient_accumulation_steps, lora_r, target_modules, finetune_*_modules,
    gradient_checkpointing, precision, optim, and model_name); machine: api.hardware.hardware(); calibrations:
    the worker's measured precision decisions (`TUNESTUDIO_HOME/cache/precision.json`, see `measured_step`);
    measured: earlier finished jobs on this machine, newest first; dataset: what the page knows of the rows
    (`rows`: usable rows, `tokens_per_row`: their mean tokens, `eval_rows`: the held-out or eval rows).
    Raises EstimateUnavailable when config.json lacks the model's shape."""
    training_type = str(job["training_type"])
    gpus = machine.get("gpus") or []
    on_gpu = bool(gpus)
    notes: list[str] = []
    # auto: a CPU starts from fp32 and a GPU from bf16/fp16 (worker/train/train.py); the activations are sized so
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
        # worker/train/memory.py's rule on the same figures: on only if the job would not fit without it, in what is
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

    # --- time: tokens a step, a measured speed, then the total ------------------------------------------------
    dataset = dataset or {}
    accumulation = int(job["gradient_accumulation_steps"])
    max_len = int(job["max_seq_length"])
    rows_per_example = 2 if job.get("method") in ("dpo", "orpo") else 1
    real = dataset.get("tokens_per_row")
    per_row = min(float(real), max_len) if isinstance(real, (int, float)) and real > 0 else None
    row_tokens = per_row if per_row is not None else float(max_len)
    step_tokens = int(job["batch_size"]) * accumulation * rows_per_example * row_tokens
    basis = [f"{step_tokens:,.0f} tokens a step: batch {job['batch_size']} x accumulation {accumulation} x "
             + (f"{per_row:,.0f} tokens a row (the dataset report's mean, cut at max_seq_length)" if per_row
                else f"max_seq_length {max_len} (every row full; the dataset report gives the real lengths)")]
    cost = flops_per_token(config, training_type)
    cores = (machine.get("cpu") or {}).get("physical_cores") or (machine.get("cpu") or {}).get("logical_cores") or 1
    assumed_flops = GPU_FLOPS if on_gpu else CPU_FLOPS_PER_CORE * cores
    same = [m for m in measured if m.model_name == job.get("model_name") and m.training_type == training_type
            and m.method == str(job.get("method", "sft"))][:MEASURED_JOBS]
    others = [m for m in measured if m not in same and m.flops_per_token][:MEASURED_JOBS]
    calibrated = measured_step(calibrations or {}, job)
    if same:
        tps = statistics.median(m.tokens_per_second for m in same)
        seconds, source = step_tokens / tps, "measured"
        basis.append(f"{tps:,.0f} tokens/s measured by job {', '.join(m.job_id for m in same)} (this model, "
                     f"{training_type}, {job.get('method', 'sft')}) on this machine")
        notes.append(basis[-1])
    elif calibrated is not None:
        seconds, source = calibrated[0] * accumulation * row_tokens / max_len, "calibration"
        tps = step_tokens / seconds
        basis.append(calibrated[1])
        notes.append(calibrated[1])
    elif others:
        speed = statistics.median(m.tokens_per_second * (m.flops_per_token or 0) for m in others)
        tps = speed / cost
        seconds, source = step_tokens / tps, "scaled"
        basis.append(f"{speed / 1e9:,.0f} GFLOP/s effective, measured by job {', '.join(m.job_id for m in others)} "
                     f"(another model) on this machine, at {cost / 1e6:,.0f} MFLOP a token for this one")
        notes.append(basis[-1])
    else:
        tps = assumed_flops / cost
        seconds, source = step_tokens / tps, "arithmetic"
        basis.append(f"no job has run on this machine yet: an assumed {assumed_flops / 1e9:,.0f} GFLOP/s at "
                     f"{cost / 1e6:,.0f} MFLOP a token")

    steps = _steps(job, dataset, rows_per_example)
    train = evaluation = generation = other = total = None
    if steps is not None:
        train = steps * seconds
        evaluation = _evaluation_seconds(job, dataset, steps, row_tokens, tps, basis)
        generation = _generation_seconds(job, dataset, cost, tps, basis)
        beyond = [m.seconds_beyond_training for m in same if m.seconds_beyond_training is not None]
        if beyond:
            # an earlier job of this model measured loading and saving (and its own evaluation and answers)
            other = max(0.0, statistics.median(beyond) - (evaluation or 0) - (generation or 0))
            basis.append(f"loading and saving: {other:,.0f} s, from the time job {same[0].job_id} spent beside "
                         "training")
        else:
            other = 3.0 + chosen.weights_bytes / LOAD_BYTES_PER_SECOND * 2
            basis.append(f"loading and saving: ~{other:,.0f} s for {chosen.weights_bytes / 1e9:,.2f} GB of weights")
        total = train + (evaluation or 0) + (generation or 0) + other
        basis.insert(1, f"{steps:,} steps" + ("" if job.get("max_steps") else
                                               f": {job.get('num_epochs')} epochs of {dataset.get('rows')} rows"))
    else:
        basis.append("the total needs max_steps or the dataset's rows (run the dataset report)")
    return Estimate(
        parameters=chosen.parameters, parameters_source="safetensors headers" if exact_parameters else "config.json",
        trainable=chosen.trainable, weights_bytes=chosen.weights_bytes, adapter_bytes=chosen.adapter_bytes,
        gradients_bytes=chosen.gradients_bytes, optimizer_bytes=chosen.optimizer_bytes,
        activations_bytes=chosen.activations_bytes, total_bytes=total, available_bytes=available, device=device,
        fits=fits, seconds_per_step=seconds, tokens_per_step=int(step_tokens), notes=notes, seconds_source=source,
        tokens_per_row=per_row, steps=steps, train_seconds=train, evaluation_seconds=evaluation,
        generation_seconds=generation, other_seconds=other, total_seconds=total, basis=basis,
    )


def _steps(job: dict[str, Any], dataset: dict[str, Any], rows_per_example: int) -> int | None:
    if int(job.get("max_steps") or 0) > 0:
        return int(job["max_steps"])
    rows = dataset.get("rows")
    if not isinstance(rows, int) or rows <= 0:
        return None
    train_rows = rows - int(dataset.get("held_out") or 0)
    per_step = int(job["batch_size"]) * int(job["gradient_accumulation_steps"])
    return max(1, math.ceil(float(job.get("num_epochs") or 1) * max(train_rows, 1) / per_step))


def _evaluation_seconds(job: dict[str, Any], dataset: dict[str, Any], steps: int, row_tokens: float, tps: float,
                        basis: list[str]) -> float | None:
    """Forward passes over the eval rows at each evaluation (a forward costs about half a LoRA step's token)."""
    every = float(job.get("eval_steps") or 0)
    rows = dataset.get("eval_rows")
    if every <= 0:
        return None
    if not isinstance(rows, int) or rows <= 0:
        basis.append("evaluations: not counted (the eval rows are unknown: run the dataset report)")
        return None
    interval = every if every >= 1 else max(1.0, every * steps)
    count = int(steps // interval) + 1  # during training, and the final one
    seconds = count * rows * row_tokens / (2 * tps)
    basis.append(f"evaluations: {count} x {rows:,} rows, forward only: {seconds:,.0f} s")
    return seconds


def _generation_seconds(job: dict[str, Any], dataset: dict[str, Any], cost: float, tps: float,
                        basis: list[str]) -> float | None:
    """Answers generated before and after training (held-out rows and sample prompts), one token at a time."""
    rows = min(int(job.get("eval_generate_rows") or 0), int(dataset.get("eval_rows") or 0)) \
        if float(job.get("eval_steps") or 0) > 0 else 0
    rows += len(job.get("sample_prompts") or ())
    if rows <= 0:
        return None
    tokens = 2 * rows * 64  # before and after; answers are short on most held-out rows (at most 256 tokens)
    per_token = DECODE_OVERHEAD_S + DECODE_SLOWDOWN * (cost / 2) / (tps * cost)
    seconds = tokens * per_token
    basis.append(f"answers before and after: {rows} prompts x ~64 tokens, one at a time: {seconds:,.0f} s")
    return seconds


def measured_step(calibrations: dict[str, Any], job: dict[str, Any]) -> tuple[float, str] | None:
    """Seconds per micro-batch for this job from what `precision: auto` measured on this machine (forward and
    backward of one batch, worker/train/calibrate.py) for the same model, method and training type: the timing of the
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
