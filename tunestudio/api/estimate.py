"""The estimate before Start: parameters, memory, whether it fits, the time a step and the time to finish.

The memory is tunestudio/estimate.py's, the model the worker's `gradient_checkpointing:
auto` decides on (arithmetic on config.json, never a loaded model: the parent does not
import torch), so the page says what the worker will do; its total is bytes: the
parts plus the worker process's own (RUNTIME_BYTES). This module adds the page's view:
the device and its free memory, whether the job fits, and time (api/estimate_time.py):

- tokens a step: batch x accumulation x the tokens a row really has (the dataset
  report's mean, cut at max_seq_length) when the page knows it, else max_seq_length;
- a formula for each part of the job's wall time (the steps, the evaluations, the
  answers before and after, starting, loading and saving), corrected by what this
  machine's finished jobs measured: the same model, training type and method first;
  the precision calibration of an earlier job (worker/train/calibrate.py); jobs of other
  models; only when nothing ran here yet, the formula alone;
- the total, each part with what it is based on (`basis`). It is an estimate; the
  page says so, and the job page shows it against the step time the job measures.

A vision-language model's job is estimated as an image job (one image a row at the job's size): its vision tower
and projector, the tokens an image takes of max_seq_length, and the tower's share of a step's FLOPs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from tunestudio.api.estimate_time import Measured, measured_from, time_job
from tunestudio.estimate import (
    RUNTIME_BYTES,
    EstimateUnavailable,
    Memory,
    Vision,
    checkpointing_needed,
    job_memory,
)

__all__ = ["Estimate", "EstimateUnavailable", "Measured", "estimate", "measured_from", "measured_step"]


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
    runtime_bytes: int  # the worker process's own: its libraries, or a CUDA context
    total_bytes: int  # the parts above, together: what the job needs at its peak
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
    evaluation_seconds: float | None = None  # the base model's, during training and the final one
    generation_seconds: float | None = None  # answers generated before and after training, the rows' losses
    other_seconds: float | None = None  # starting, loading the model and data, saving
    total_seconds: float | None = None
    basis: list[str] = field(default_factory=list)  # what each figure rests on, one line each
    # an image job's vision tower: its parameters and trained ones, its activations, what one image becomes (side,
    # views, patches, tokens) and the images a row (tunestudio.estimate.Vision); None for a text job
    vision: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def estimate(config: dict[str, Any], job: dict[str, Any], machine: dict[str, Any],
             exact_parameters: int | None = None, calibrations: dict[str, Any] | None = None,
             measured: Sequence[Measured] = (), dataset: dict[str, Any] | None = None) -> Estimate:
    """config: the model's config.json; job: JobConfig fields (training_type, method, batch_size,
    max_seq_length, gradient_accumulation_steps, lora_r, target_modules, finetune_*_modules,
    gradient_checkpointing, precision, optim, max_steps, num_epochs, eval_steps, eval_generate_rows,
    sample_prompts, and model_name); machine: api.hardware.hardware(); calibrations: the worker's measured
    precision decisions (`TUNESTUDIO_HOME/cache/precision.json`, see `measured_step`); measured: earlier finished
    jobs on this machine, newest first (`measured_from`); dataset: what the page knows of the rows (`rows`: usable
    rows, `tokens_per_row`: their mean tokens, `eval_rows`: the held-out or eval rows, `held_out`: of `rows`,
    those held out). Raises EstimateUnavailable when config.json lacks the model's shape."""
    if config.get("is_encoder_decoder") and "num_mel_bins" in config:  # the shapes below are decoders' and VLMs'
        raise EstimateUnavailable(f"a speech encoder-decoder ({config.get('model_type')}): its memory and time are "
                                  "not estimated yet (the job's progress reports its peak memory as it trains)")
    device, available, on_gpu = _device(machine)
    notes: list[str] = []
    job = _with_images(config, job, notes)
    chosen = _memory(config, job, on_gpu, available, exact_parameters, notes)
    if chosen.vision is not None:
        notes.extend(_image_notes(chosen.vision, int(job["max_seq_length"])))
    total_bytes = chosen.total_bytes + RUNTIME_BYTES
    if str(job["training_type"]) == "qlora" and not on_gpu:
        notes.append("QLoRA trains on a CPU here (bitsandbytes), slowly")
    timed = time_job(config, job, dataset or {}, machine, measured_step(calibrations or {}, job), measured)
    return Estimate(
        parameters=chosen.parameters, parameters_source="safetensors headers" if exact_parameters else "config.json",
        trainable=chosen.trainable, weights_bytes=chosen.weights_bytes, adapter_bytes=chosen.adapter_bytes,
        gradients_bytes=chosen.gradients_bytes, optimizer_bytes=chosen.optimizer_bytes,
        activations_bytes=chosen.activations_bytes, runtime_bytes=RUNTIME_BYTES, total_bytes=total_bytes,
        available_bytes=available, device=device, fits=None if available is None else total_bytes <= available,
        seconds_per_step=timed.seconds_per_step, tokens_per_step=timed.tokens_per_step, notes=notes + timed.notes,
        seconds_source=timed.source, tokens_per_row=timed.tokens_per_row, steps=timed.steps,
        train_seconds=timed.train, evaluation_seconds=timed.evaluation, generation_seconds=timed.generation,
        other_seconds=timed.other, total_seconds=timed.total, basis=timed.basis,
        vision=chosen.vision.as_dict() if chosen.vision else None,
    )


def _with_images(config: dict[str, Any], job: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """The job as the worker will run it: a vision-language model's job is an image job. The form leaves
    is_dataset_image off, as the worker detects image rows when the job starts (worker/modalities.detected), and
    these models train on images (most of them cannot load as a text model at all), so the estimate counts the
    images unless the form says otherwise."""
    if job.get("is_dataset_image") or not isinstance(config.get("vision_config"), dict):
        return job
    notes.append("a vision-language model: the estimate counts one image a row (is_dataset_image is detected from "
                 "the rows when the job starts)")
    return {**job, "is_dataset_image": True}


def _image_notes(vision: Vision, max_seq_length: int) -> list[str]:
    image = vision.image
    views = f"{image.views} views" if image.views > 1 else "one view"
    notes = [f"images: {image.tokens} tokens each, within max_seq_length {max_seq_length} ({views} of {image.side} "
             f"px: {image.patches:,} patches through the vision tower, "
             + ("which trains)" if vision.trains else "frozen)")]
    if image.tokens >= max_seq_length:
        notes.append(f"an image alone is {image.tokens} tokens, not less than max_seq_length {max_seq_length}: every "
                     "row with one would be refused; raise max_seq_length or lower max_image_size")
    if vision.approximate:
        notes.append(f"the {vision.family} vision tower is counted as a plain SigLIP tower: approximate")
    return notes


def _device(machine: dict[str, Any]) -> tuple[str, int | None, bool]:
    """(the device a job trains on, its memory in bytes (None: unknown), whether it is a GPU)."""
    gpus = machine.get("gpus") or []
    if gpus:
        gpu = max(gpus, key=lambda g: g.get("memory_total_mb") or 0)
        return f"GPU {gpu.get('name', '')}".strip(), int((gpu.get("memory_total_mb") or 0) * 2**20) or None, True
    available = int(((machine.get("memory") or {}).get("available_mb") or 0) * 2**20) or None
    return "CPU (available memory)", available, False


def _memory(config: dict[str, Any], job: dict[str, Any], on_gpu: bool, available: int | None,
            exact_parameters: int | None, notes: list[str]) -> Memory:
    """The memory of the job as the worker will run it: checkpointing decided by worker/train/memory.py's rule."""
    # auto: a CPU starts from fp32 and a GPU from bf16/fp16 (worker/train/train.py); the activations are sized so
    precision = str(job["precision"])
    compute = precision if precision != "auto" else ("bf16" if on_gpu else "fp32")

    def needs(checkpointing: bool) -> Memory:
        return job_memory(config, job, precision=compute, checkpointing=checkpointing, parameters=exact_parameters)

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
    return needs(True) if checkpointing else plain


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
