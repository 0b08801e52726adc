"""The estimate before Start: parameters, trainable parameters, memory and a rough time per step.

Arithmetic on the model's config.json (a decoder-only transformer: embeddings, attention,
MLP, norms), never a loaded model: the parent process does not import torch. Memory follows
the usual accounting: weights, adapter, gradients, optimizer state, activations (stored per
layer per token, ~34·hidden bytes in 16-bit without checkpointing, Korthikanti et al. 2022,
with sdpa attention keeping no seq² scores) and the logits. It is an estimate; the page says so.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

GIB = 1024**3
# Model types whose MLP has two matrices (up, down) rather than three (gate, up, down).
_TWO_MATRIX_MLP = {"gpt2", "gpt_neox", "gptj", "opt", "bloom", "falcon", "phi", "starcoder2", "gpt_bigcode"}
# Optimizer state, bytes per trainable parameter.
_OPTIMIZER_BYTES = {"adamw_8bit": 2.0, "paged_adamw_8bit": 2.0, "sgd": 0.0, "adafactor": 0.5}
# Effective training speed, FLOP/s: a fraction of peak that small jobs reach (tunestudio measured ~6,300
# tok/s on the 755k tiny model on 2 cores: about 30 GFLOP/s). A GPU: an assumed 30 TFLOP/s.
CPU_FLOPS_PER_CORE = 15e9
GPU_FLOPS = 30e12


class EstimateUnavailable(ValueError):
    """The config lacks what the arithmetic needs."""


@dataclass
class Shape:
    hidden: int
    layers: int
    vocab: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool
    mlp_matrices: int

    @classmethod
    def of(cls, config: dict[str, Any]) -> Shape:
        def first(*names: str) -> Any:
            return next((config[n] for n in names if isinstance(config.get(n), int) and config[n] > 0), None)

        hidden = first("hidden_size", "n_embd", "d_model")
        layers = first("num_hidden_layers", "n_layer", "num_layers")
        vocab = first("vocab_size")
        heads = first("num_attention_heads", "n_head")
        if not (hidden and layers and vocab and heads):
            raise EstimateUnavailable("config.json lacks hidden_size, num_hidden_layers, vocab_size or "
                                      "num_attention_heads")
        return cls(
            hidden=hidden, layers=layers, vocab=vocab, heads=heads,
            intermediate=first("intermediate_size", "n_inner", "ffn_dim") or 4 * hidden,
            kv_heads=first("num_key_value_heads") or heads,
            head_dim=first("head_dim") or hidden // heads,
            tied=bool(config.get("tie_word_embeddings", config.get("model_type") in _TWO_MATRIX_MLP)),
            mlp_matrices=2 if config.get("model_type") in _TWO_MATRIX_MLP else 3,
        )

    def linears(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear layer of one block, by the module name LoRA targets."""
        h, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        out = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
               "up_proj": (h, i), "down_proj": (i, h)}
        if self.mlp_matrices == 3:
            out["gate_proj"] = (h, i)
        return out

    def parameters(self) -> tuple[int, int]:
        """(all parameters, those in the blocks' linear layers)."""
        linear = self.layers * sum(a * b for a, b in self.linears().values())
        norms = self.layers * 2 * self.hidden + self.hidden
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return linear + norms + embeddings, linear


_ATTENTION = {"q_proj", "k_proj", "v_proj", "o_proj"}


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
    """config: the model's config.json; job: JobConfig fields (training_type, batch_size, max_seq_length,
    gradient_accumulation_steps, lora_r, target_modules, finetune_*_modules, gradient_checkpointing, precision,
    optim, and model_name); machine: api.hardware.hardware(); calibrations: the worker's measured precision
    decisions (`TUNESTUDIO_HOME/cache/precision.json`, see `measured_step`)."""
    from tunestudio.api.modelinfo import text_config

    shape = Shape.of(text_config(config))
    counted, linear = shape.parameters()
    params = exact_parameters or counted
    method = str(job["training_type"])
    gpus = machine.get("gpus") or []
    on_gpu = bool(gpus)
    notes: list[str] = []

    # --- bytes per weight -----------------------------------------------------------------------
    precision = str(job["precision"])
    half = precision in ("bf16", "fp16") or (precision == "auto" and on_gpu)
    weight_bytes = 2 if half else 4
    if method == "qlora":
        # nf4: half a byte per block weight plus its scales; everything else stays in the compute dtype.
        weights = int(linear * 0.5 * 1.07 + (params - linear) * weight_bytes)
    else:
        weights = params * weight_bytes

    # --- what trains ------------------------------------------------------------------------------
    if method == "full":
        trainable = params
        adapter = 0
        gradients = trainable * weight_bytes
    else:
        targets = _targets(shape, job)
        r = int(job["lora_r"])
        trainable = shape.layers * sum(r * (a + b) for name, (a, b) in shape.linears().items() if name in targets)
        adapter = trainable * 4  # adapters are kept in fp32
        gradients = trainable * 4
    optimizer = int(trainable * _OPTIMIZER_BYTES.get(str(job["optim"]), 8.0))  # AdamW: two fp32 moments

    # --- activations at this batch and length --------------------------------------------------------
    batch, length = int(job["batch_size"]), int(job["max_seq_length"])
    tokens = batch * length
    act_scale = 1.0 if half else 2.0  # the 34·h bytes figure is for 16-bit activations
    per_layer = 34 * shape.hidden * tokens * act_scale
    checkpointed = shape.layers * 2 * shape.hidden * tokens * act_scale + per_layer  # layer inputs, one layer live
    if str(job.get("method", "sft")) in ("sft", "pretrain"):
        # TRL's fused LM head (SFTTrainer): the loss in tiles of 4096 tokens x 32768 entries, never full logits
        logits = min(tokens, 4096) * min(shape.vocab, 32768) * 4 * 2 + tokens * 16
    else:
        logits = 2 * tokens * shape.vocab * 4  # fp32 logits and their gradient
    overhead = int(0.5 * GIB)  # the runtime itself: CUDA context or the CPU process's libraries
    before_activations = weights + adapter + gradients + optimizer + logits + overhead
    if on_gpu:
        gpu = max(gpus, key=lambda g: g.get("memory_total_mb") or 0)
        available = int((gpu.get("memory_total_mb") or 0) * 2**20) or None
        device = f"GPU {gpu.get('name', '')}".strip()
    else:
        memory = machine.get("memory") or {}
        available = int((memory.get("available_mb") or 0) * 2**20) or None
        device = "CPU (available memory)"
    checkpointing = job.get("gradient_checkpointing")
    if checkpointing == "auto":  # the rule of worker/memory.py on these figures: on only if it would not fit without
        checkpointing = available is not None and before_activations + shape.layers * per_layer > 0.9 * available
        notes.append("activation checkpointing auto: " + ("on, the job would not fit without it" if checkpointing
                                                          else "off, the job fits without it"))
    elif checkpointing:
        notes.append("activation checkpointing: less memory, slower steps")
    stored = checkpointed if checkpointing else shape.layers * per_layer
    activations = int(stored + logits)
    total = before_activations + int(stored)
    fits = None if available is None else total <= available
    if method == "qlora" and not on_gpu:
        notes.append("QLoRA trains on a CPU here (bitsandbytes), slowly")

    # --- a rough time per step: 6·N·tokens FLOPs for a full fine-tune, ~4·N·tokens with a frozen base --------
    accumulation = int(job["gradient_accumulation_steps"])
    step_tokens = tokens * accumulation
    flops = (6 if method == "full" else 4) * params * step_tokens
    cores = (machine.get("cpu") or {}).get("physical_cores") or (machine.get("cpu") or {}).get("logical_cores") or 1
    speed = GPU_FLOPS if on_gpu else CPU_FLOPS_PER_CORE * cores
    seconds, source = flops / speed, "arithmetic"
    measured = measured_step(calibrations or {}, job)
    if measured is not None:
        seconds, source = measured[0] * accumulation, "calibration"
        notes.append(measured[1])
    return Estimate(
        parameters=params, parameters_source="safetensors headers" if exact_parameters else "config.json",
        trainable=trainable, weights_bytes=weights, adapter_bytes=adapter, gradients_bytes=gradients,
        optimizer_bytes=optimizer, activations_bytes=activations, total_bytes=total, available_bytes=available,
        device=device, fits=fits, seconds_per_step=seconds, tokens_per_step=step_tokens, notes=notes,
        seconds_source=source,
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


def _targets(shape: Shape, job: dict[str, Any]) -> set[str]:
    names = set(shape.linears())
    chosen = job.get("target_modules")
    if chosen:
        return {n for n in names if any(n == t or n.endswith(t) or t.endswith(n) for t in chosen)}
    if not job.get("finetune_attention_modules", True):
        names -= _ATTENTION
    if not job.get("finetune_mlp_modules", True):
        names &= _ATTENTION
    return names
