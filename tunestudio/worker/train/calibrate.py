"""`precision: auto`, decided by measurement on the job itself.

No fixed rule held (FACTS.md): bf16 autocast was 2.9x faster than fp32 for a
full fine-tune of a random 30M Llama, 25% slower for LoRA on a real 270M model
with a 262k vocabulary, and 40% slower on the tiny model. So, before training,
on the job's model and one real batch of its data at its length and batch
size, forward+backward passes are timed in each precision the hardware
supports (a warm-up each, then up to 3 rounds with the precisions alternating,
so a change in the machine's load falls on all alike; the fastest time of each
counts); the fastest whose loss agrees with fp32 wins, a reduced precision only
when it beats fp32 by more than REDUCED_MARGIN (a tie measured on one batch turned
into a loss over a whole job in bench/precision.py; fp32 is the exact one). The decision is cached
per (model, method, training type, shape, hardware) so a repeated job does not
pay again, and a job too short to repay the measurement (under MIN_JOB_S, or
under MEASURE_SHARE times the measuring) skips it: fp32.
Weights are never changed (no optimizer step; gradients are cleared) and the
RNG state is restored, so a calibrated job trains exactly as a fixed one would.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from tunestudio.config import METHOD_SPECS
from tunestudio.worker.train import performance

BUDGET_S = 6.0  # measuring rounds after the first stop once they would pass this (warm-ups and one round: always)
MIN_JOB_S = 30.0  # a job whose fp32 estimate is shorter than this is not measured
SLOW_FLOPS = 2e10  # a slow machine's training FLOP/s: below MIN_JOB_S at this rate, a job is surely short
LOSS_AGREEMENT = 0.02  # relative difference to fp32's loss allowed for a candidate
MEASURE_SHARE = 20  # a measured job is at least this many times longer than its measurement
BUSY_SHARE = 0.6  # below this share of its cores while measuring, a decision is not cached
# A reduced precision must be at least this much faster than fp32 to be chosen. bench/precision.py (run 4):
# bf16 measured 1.2% faster on one batch of a full fine-tune, and the whole job ran 4-10% slower in bf16
# than in fp32. Rounds of the same measurement differ by a few per cent; with the margin auto stays within
# that of the faster precision either way (issue 18: auto >= 0.95 x the faster fixed precision).
REDUCED_MARGIN = 0.05
RULE = 2  # part of the cache key: decisions cached under an earlier rule are measured again


@dataclass
class Decision:
    precision: str
    reason: str
    seconds_per_step: dict[str, float] = field(default_factory=dict)
    losses: dict[str, float] = field(default_factory=dict)
    cached: bool = False
    # What was measured, readable by the parent's estimate (api/estimate.py): model_name, method,
    # training_type, batch_size, max_seq_length
    job: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        timings = ", ".join(f"{k} {v * 1000:.0f} ms/step" for k, v in self.seconds_per_step.items())
        return f"precision auto → {self.precision} ({self.reason}{'; cached' if self.cached else ''}" + (
            f"; measured {timings})" if timings else ")")


def candidates() -> list[str]:
    """fp32 and what the hardware runs faster in reduced precision, if anything."""
    if torch.cuda.is_available():
        return ["fp32", "bf16" if torch.cuda.is_bf16_supported() else "fp16"]
    return ["fp32", "bf16"] if performance.cpu_has_bf16_matmul() else ["fp32"]


def hardware_key() -> str:
    if torch.cuda.is_available():
        return f"cuda:{torch.cuda.get_device_name(0)}"
    model = ""
    with contextlib.suppress(OSError):
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), "")
    return f"cpu:{model}:{performance.available_cores()}:{'bf16' if performance.cpu_has_bf16_matmul() else ''}"


def cache_key(model_name: str, method: str, training_type: str, batch_shape: tuple[int, ...]) -> str:
    raw = json.dumps([model_name, method, training_type, list(batch_shape), hardware_key(), torch.__version__, RULE])
    return hashlib.sha256(raw.encode()).hexdigest()[:24]


@contextlib.contextmanager
def _rng_kept() -> Iterator[None]:
    """Every random state the trainer draws from (torch, Python, NumPy), as it was before."""
    import random

    import numpy as np

    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    py, npy = random.getstate(), np.random.get_state()
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(npy)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def _autocast(precision: str, device: torch.device) -> Any:
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


def fused_head(model: torch.nn.Module) -> bool:
    """Whether TRL has patched the model with its fused LM head (SFTTrainer does): the loss is computed in tiles
    over the labelled positions only, never as full logits. Calibration then times that path, as training runs it."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    code = getattr(getattr(base.forward, "__func__", None), "__code__", None)  # functools.wraps keeps the old name
    return code is not None and code.co_name == "_fused_forward"


def _step(model: torch.nn.Module, batch: dict[str, torch.Tensor], precision: str) -> float:
    device = next(model.parameters()).device
    extra = {"fused_lm_head": True} if fused_head(model) else {}
    with _autocast(precision, device):
        loss = model(**batch, **extra).loss
    loss.backward()
    model.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return float(loss.detach())


def _rounds(model: torch.nn.Module, batch: dict[str, torch.Tensor], options: list[str], budget: float,
            first: dict[str, float]) -> dict[str, float]:
    """Seconds per step of each option: the fastest of up to 3 rounds, the options alternating within a round
    so that a change in the machine's load falls on all of them alike. At least one round; more while the
    budget lasts. `first`: the warm-up step's time of each option, which stands in if no round fits the budget."""
    best = dict(first)
    started = time.perf_counter()
    for round_ in range(3):
        if round_ and time.perf_counter() - started + sum(best.values()) > budget:
            break
        for option in options if round_ % 2 == 0 else list(reversed(options)):
            t0 = time.perf_counter()
            _step(model, batch, option)
            best[option] = min(best[option], time.perf_counter() - t0) if round_ else time.perf_counter() - t0
    return best


def decide(
    model: torch.nn.Module, batch: dict[str, Any], total_steps: int, accumulation: int, key: str,
    cache_dir: Path | None, job: dict[str, Any] | None = None,
) -> Decision:
    """The precision for this job: measured, cached, or fp32 when there is nothing to choose or no time to."""
    options = candidates()
    if len(options) == 1:
        return Decision(options[0], "the only precision this hardware runs fast")
    cache = cache_dir / "precision.json" if cache_dir else None
    known = _read(cache)
    if key in known:
        return Decision(**{**known[key], "cached": True})
    device = next(model.parameters()).device
    batch = {k: v.to(device) for k, v in batch.items() if isinstance(v, torch.Tensor)}
    was_training = model.training
    model.train()
    try:
        measured = _apart(device, lambda: _measure(model, batch, options, accumulation, total_steps, device))
    finally:
        model.train(was_training)
    if isinstance(measured, Decision):
        return measured
    seconds, losses, share = measured
    precision, reason = choose(seconds, losses)
    decision = Decision(precision, reason, seconds, losses, job=job or {})
    if share is not None and share < BUSY_SHARE:
        # Other work had the cores: timings taken so were off by up to 20x in bench/precision.py. The job
        # uses them, but they are not kept: the next job measures again.
        decision.reason += f"; measured on a busy machine ({share:.0%} of its cores): not cached"
        return decision
    _write(cache, {**known, key: {k: v for k, v in asdict(decision).items() if k != "cached"}})
    return decision


def _measure(model: torch.nn.Module, batch: dict[str, torch.Tensor], options: list[str], accumulation: int,
             total_steps: int, device: torch.device) -> Decision | tuple[dict[str, float], dict[str, float], Any]:
    """The options' times and losses (and the share of the cores had), or fp32's Decision for a job too short."""
    with _rng_kept():
        # One warm-up step each (the first step pays for allocations and autocast's weight casts), the loss
        # of each, and a first time to judge whether the job repays a measurement at all.
        first, losses = {}, {}
        for option in options:
            t0 = time.perf_counter()
            losses[option] = _step(model, batch, option)
            first[option] = time.perf_counter() - t0
        job_s = first["fp32"] * accumulation * total_steps
        measuring_s = 2 * sum(first.values())
        if job_s < max(MIN_JOB_S, MEASURE_SHARE * measuring_s):
            return Decision("fp32", f"a job of about {job_s:.0f} s does not repay measuring",
                            {"fp32": first["fp32"]}, {"fp32": losses["fp32"]})
        cpu0, wall0 = time.process_time(), time.perf_counter()
        seconds = _rounds(model, batch, options, BUDGET_S, first)
        return seconds, losses, _share_of_cores(cpu0, wall0, device)


def _apart(device: torch.device, measure: Callable[[], Any]) -> Any:
    """measure() on a CPU: on a thread of its own, which ends with it, its malloc arena trimmed after. A bf16 autocast
    step on the training thread left its fp32 steps slower for the rest of the job (a LoRA step of the tiny SmolVLM:
    32 ms before one bf16 step, 40 ms after; unchanged when that step ran on another thread). Most of it was glibc's
    thresholds moving (performance.configure_allocator now fixes them); with them fixed, about 4 % stayed with the
    thread that ran bf16. On a GPU (the current device is a thread's own) it runs here."""
    if device.type != "cpu":
        return measure()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tunestudio-calibrate") as pool:
        result = pool.submit(measure).result()
    performance.release_free_memory()  # the thread's own malloc arena, free now, else kept beside the training's
    return result


def choose(seconds: dict[str, float], losses: dict[str, float]) -> tuple[str, str]:
    """The precision and why: fp32, unless a reduced precision whose loss agrees with fp32's is more than
    REDUCED_MARGIN faster."""
    fp32_loss = losses["fp32"]
    agreeing = [o for o in seconds if o != "fp32"
                and abs(losses[o] - fp32_loss) <= LOSS_AGREEMENT * max(abs(fp32_loss), 1e-6)]
    faster = [o for o in agreeing if seconds[o] < (1 - REDUCED_MARGIN) * seconds["fp32"]]
    if faster:
        return min(faster, key=seconds.__getitem__), "fastest measured whose loss agrees with fp32"
    if len(agreeing) < len(seconds) - 1:
        return "fp32", "a reduced precision's loss disagrees with fp32's"
    return "fp32", f"no reduced precision measured {REDUCED_MARGIN:.0%} faster than fp32"


def _share_of_cores(cpu0: float, wall0: float, device: torch.device) -> float | None:
    """The share of its threads' cores this process had while measuring (CPU time over threads x wall time);
    None on a GPU, whose work the CPU clock does not see."""
    if device.type != "cpu":
        return None
    wall = time.perf_counter() - wall0
    return (time.process_time() - cpu0) / (torch.get_num_threads() * wall) if wall > 0 else None


def _read(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write(path: Path | None, data: dict[str, Any]) -> None:
    if path is None:
        return
    with contextlib.suppress(OSError):  # a cache that cannot be written costs a measurement next time, no more
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
        tmp.replace(path)


def for_job(cfg: Any, trainer: Any, cache_dir: Path | None) -> Decision | None:
    """The measured decision for a job with `precision: auto` (None otherwise), on a batch of its own data.

    QLoRA keeps its rule: its compute dtype is fixed when the 4-bit weights load. Methods other than SFT
    and pretraining are not measured (their batches are not one labelled forward pass).
    """
    if cfg.precision != "auto" or cfg.training_type.value == "qlora":
        return None
    if not _measurable(cfg):
        # Preference and RL batches are not one forward pass with labels; those methods stay in fp32 on a CPU.
        return Decision("fp32", f"not measured for method {cfg.method}")
    rows = len(trainer.train_dataset)
    steps_per_epoch = max(1, rows // (cfg.batch_size * cfg.gradient_accumulation_steps))
    total = cfg.max_steps if cfg.max_steps > 0 else int(steps_per_epoch * cfg.num_epochs)
    # A job that would be short even on a slow machine is not worth a measurement, nor touching its data.
    params = sum(p.numel() for p in trainer.model.parameters())
    flops = 6 * params * cfg.batch_size * cfg.max_seq_length * cfg.gradient_accumulation_steps * total
    if flops / SLOW_FLOPS < MIN_JOB_S:
        return Decision("fp32", f"a job of at most about {flops / SLOW_FLOPS:.0f} s does not repay measuring")
    with _rng_kept():  # a shuffling sampler draws its seed from torch's RNG: the job's data order stays its own
        batch = next(iter(trainer.get_train_dataloader()))
    job = {"model_name": cfg.model_name, "method": str(cfg.method), "training_type": cfg.training_type.value,
           "batch_size": cfg.batch_size, "max_seq_length": cfg.max_seq_length}
    return decide(trainer.model, batch, total, cfg.gradient_accumulation_steps, _job_key(cfg), cache_dir, job)


def _measurable(cfg: Any) -> bool:
    """Whether `auto` is measured for the job: not QLoRA (its compute dtype is fixed when the 4-bit weights
    load), and SFTTrainer's methods only (sft, pretrain: other trainers' batches are not one labelled forward
    pass)."""
    return cfg.training_type.value != "qlora" and METHOD_SPECS[str(cfg.method)].trainer_for(cfg.modality) == "sft"


def _job_key(cfg: Any) -> str:
    return cache_key(cfg.model_name, str(cfg.method), cfg.training_type.value,
                     (cfg.batch_size, cfg.max_seq_length, int(cfg.packing), cfg.lora_r))


def cached(cfg: Any, cache_dir: Path | None) -> Decision | None:
    """The decision an earlier job measured for this one, read before anything is built: the worker then
    builds the trainer once, in that precision (None: for_job decides after the trainer is built)."""
    if cfg.precision != "auto" or not _measurable(cfg) or len(candidates()) == 1 or cache_dir is None:
        return None
    entry = _read(cache_dir / "precision.json").get(_job_key(cfg))
    if not isinstance(entry, dict):
        return None
    try:
        decision = Decision(**{**entry, "cached": True})
    except TypeError:  # an entry of another version's shape: measured again
        return None
    return decision if decision.precision in candidates() else None
