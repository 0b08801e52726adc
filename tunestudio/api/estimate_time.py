"""The time a job takes, by formula, corrected by what this machine's finished jobs measured (api/estimate.py).

Where the time goes, in the order it happens (worker/main.py), each a part of the formula:
- start, loading and saving (`other`): the worker forks from the server's prewarmed process (START_S), reads the
  weights, reads and tokenises the rows, builds the trainer, and at the end writes the adapter or the weights;
- the steps (`train`): per step a fixed cost (the optimizer, the trainer's Python, a progress event; on the tiny
  model it is most of a step) and the FLOPs of its tokens at the machine's training speed;
- the evaluations (`evaluation`): the base model's, one every eval_steps, and a final one unless the last step
  had it: a forward pass over the eval rows each;
- the answers (`generation`), before training and after: the sample prompts (up to SAMPLE_TOKENS each, one at a
  time) and up to eval_generate_rows held-out rows (in batches, up to twice the reference's length), and the loss
  of each of the first SCORED_ROWS held-out rows. A decoded token reads every weight once: its time is the
  weights' bytes over the memory's speed, plus a fixed cost per layer (Python, small kernels), not its FLOPs.

The formula's figures were measured on this kind of machine (2 cores, quiet: bench/estimate.py); another machine,
or this one loaded by other work (a step 10-30x slower, measured), differs. So a finished job corrects them, as
two ratios of what it measured to what the formula says of that same job: its steps (`step factor`, from its
metrics, evaluations left out), and the rest of its wall time (`rest factor`). Jobs of the same model, training
type and method first ("measured"); else the precision calibration's timing of a step ("calibration"); else jobs
of other models ("scaled": the ratios carry over, the formula scales to this model); else the formula alone
("arithmetic").
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tunestudio.config import METHOD_SPECS
from tunestudio.estimate import Shape, flops_per_token, image_flops, job_memory
from tunestudio.worker.train import BATCH as ANSWER_BATCH
from tunestudio.worker.train import LOSS_BATCH, MAX_NEW_TOKENS, SCORED_ROWS

__all__ = ["MEASURED_JOBS", "Facts", "Measured", "Parts", "Rates", "Timing", "measured_from", "time_job"]

# Training speed when nothing ran here, FLOP/s: bench/realistic.py measured a LoRA step of a SmolLM-shaped 135M
# model at ~53 GFLOP/s on one thread of this kind of CPU in fp32; two threads do not double it. A GPU: assumed.
CPU_FLOPS_PER_CORE = 35e9
GPU_FLOPS = 30e12
STEP_S = 0.015  # a step's fixed cost: the tiny model's steps took 16-19 ms, 3 of them its FLOPs (bench/estimate.py)
EVAL_BATCH_S = 0.005  # an evaluation batch's fixed cost
# A decoded token: the weights read once, at the memory's speed, plus a fixed cost per layer. Measured: the tiny
# model 2.2 ms a token, the 116M real-shaped one 30 ms (464 MB of fp32 weights) on 2 quiet cores. A GPU: assumed.
CPU_BYTES_PER_S = 16e9
GPU_BYTES_PER_S = 1e12
DECODE_TOKEN_S = 0.001
DECODE_LAYER_S = 0.0005
SAMPLE_TOKENS = 40  # worker/train/train.py generate(): a sample prompt's answer, at most
START_S = 1.0  # submit to the worker's first phase: a fork of the prewarmed process (0.5-1.6 s measured)
LOAD_BYTES_PER_S = 1e9  # reading safetensors (from the page cache: faster; 464 MB in 0.2 s measured)
DATA_S = 0.7  # reading the rows and building the trainer (0.2 s for the tiny model, 0.7-0.95 s for 116M)
TOKENS_PER_S = 1e6  # tokenising the rows (bench/dataset_report.py: 50k rows of ~500 tokens in 28 s)
SAVE_BYTES_PER_S = 300e6
MEASURED_JOBS = 3  # the latest finished jobs of a kind whose ratios are taken (median)


@dataclass(frozen=True)
class Rates:
    """The machine's speeds as the formula assumes them."""

    flops: float
    bytes_per_s: float
    name: str

    @classmethod
    def of(cls, machine: dict[str, Any]) -> Rates:
        if machine.get("gpus"):
            return cls(GPU_FLOPS, GPU_BYTES_PER_S, "GPU")
        cpu = machine.get("cpu") or {}
        cores = cpu.get("physical_cores") or cpu.get("logical_cores") or 1
        return cls(CPU_FLOPS_PER_CORE * cores, CPU_BYTES_PER_S, f"{cores} CPU cores")


@dataclass(frozen=True)
class Facts:
    """What the formula knows of a job's rows: tokens a step, steps, eval rows (None: unknown)."""

    per_row: float | None  # the rows' mean tokens, cut at max_seq_length (None: unknown, max_seq_length assumed)
    row_tokens: float
    step_tokens: float
    steps: int | None
    rows: int | None
    eval_rows: int | None

    @classmethod
    def of(cls, job: dict[str, Any], dataset: dict[str, Any]) -> Facts:
        max_len = int(job["max_seq_length"])
        real = dataset.get("tokens_per_row")
        per_row = min(float(real), max_len) if isinstance(real, (int, float)) and real > 0 else None
        row_tokens = per_row if per_row is not None else float(max_len)
        per_step = int(job["batch_size"]) * int(job["gradient_accumulation_steps"])
        rows = dataset.get("rows") if isinstance(dataset.get("rows"), int) and dataset["rows"] > 0 else None
        steps = None
        if int(job.get("max_steps") or 0) > 0:
            steps = int(job["max_steps"])
        elif rows is not None:
            train_rows = max(rows - int(dataset.get("held_out") or 0), 1)
            steps = max(1, math.ceil(float(job.get("num_epochs") or 1) * train_rows / per_step))
        eval_rows = dataset.get("eval_rows") if isinstance(dataset.get("eval_rows"), int) else None
        return cls(per_row, row_tokens, per_step * _rows_per_example(job) * row_tokens, steps, rows, eval_rows)


@dataclass(frozen=True)
class Parts:
    """The formula's seconds for one job, and what each rests on."""

    step: float
    train: float | None
    evaluation: float | None
    generation: float | None
    other: float
    basis: list[str]

    @property
    def rest(self) -> float:
        return (self.evaluation or 0.0) + (self.generation or 0.0) + self.other


@dataclass(frozen=True)
class Measured:
    """A finished training job on this machine, as the formula can be held against it (`measured_from`)."""

    job_id: str
    model_name: str
    training_type: str
    method: str
    config: dict[str, Any] | None  # its model's config.json (None: gone, so it cannot be compared)
    job: dict[str, Any]  # its estimate fields (api/routes/models.py ESTIMATE_FIELDS)
    steps: int
    step_seconds: float  # its steps' time, evaluations left out
    tokens_per_row: float | None  # from the tokens it trained on
    eval_rows: int | None
    rest_seconds: float | None  # its wall time less its steps (None: stopped, or not comparable)


@dataclass
class Timing:
    seconds_per_step: float
    tokens_per_step: int
    source: str
    tokens_per_row: float | None
    steps: int | None
    train: float | None
    evaluation: float | None
    generation: float | None
    other: float | None
    total: float | None
    basis: list[str]
    notes: list[str] = field(default_factory=list)


def _rows_per_example(job: dict[str, Any]) -> int:
    """Sequences a batch runs per example (a pair's chosen and rejected answer: 2), as the method's entry says."""
    return METHOD_SPECS[str(job.get("method", "sft"))].rows_per_example


def formula(config: dict[str, Any], job: dict[str, Any], facts: Facts, rates: Rates) -> Parts:
    """The formula's seconds for a job on this model (config: its config.json), rows as `facts` says."""
    shape = Shape.of(config)
    training_type = str(job["training_type"])
    forward = 2.0 * shape.compute_parameters()  # FLOPs a token of a forward pass
    pictures = image_flops(config, job)  # an image job's: a row's images in the vision tower
    rows = facts.step_tokens / max(facts.row_tokens, 1.0)
    step = STEP_S + (facts.step_tokens * flops_per_token(config, training_type) + rows * pictures) / rates.flops
    basis: list[str] = []
    if pictures:
        basis.append(f"images: {pictures / 1e9:,.1f} GFLOP a row in the vision tower, {rows:,.0f} rows a step")
    train = None if facts.steps is None else facts.steps * step
    memory = job_memory(config, job, precision="fp32", checkpointing=False)
    weights = memory.weights_bytes
    evaluation = _evaluations(job, facts, forward, rates, basis)
    # a decoded token reads the weights a token meets: all but the embedding (a lookup)
    read = weights * shape.compute_parameters() / max(memory.parameters, 1)
    generation = _answers(shape, job, facts, forward, read, rates, basis)
    saved = weights if training_type == "full" else memory.adapter_bytes
    other = (START_S + weights / LOAD_BYTES_PER_S + DATA_S + (facts.rows or 0) * facts.row_tokens / TOKENS_PER_S
             + saved / SAVE_BYTES_PER_S)
    basis.append(f"start, loading and saving: ~{other:,.1f} s (the worker's start, {weights / 1e9:,.2f} GB of "
                 "weights read, the rows tokenised, the result written)")
    return Parts(step, train, evaluation, generation, other, basis)


def _pass_seconds(rows: int, batch: int, facts: Facts, forward: float, rates: Rates) -> float:
    """A forward pass over `rows` eval rows in batches of `batch`."""
    return math.ceil(rows / max(batch, 1)) * EVAL_BATCH_S + rows * facts.row_tokens * forward / rates.flops


def _evaluations(job: dict[str, Any], facts: Facts, forward: float, rates: Rates, basis: list[str]) -> float | None:
    every = float(job.get("eval_steps") or 0)
    if every <= 0 or facts.steps is None:
        return None
    if facts.eval_rows is None:
        basis.append("evaluations: not counted (the eval rows are unknown: run the dataset report)")
        return None
    interval = every if every >= 1 else max(1.0, every * facts.steps)
    during = int(facts.steps // interval)
    final = 0 if during and math.isclose(facts.steps % interval, 0) else 1  # else the last one is the final one
    count = 1 + during + final  # the base model's first
    rows = facts.eval_rows * _rows_per_example(job)
    seconds = count * _pass_seconds(rows, int(job["batch_size"]), facts, forward, rates)
    basis.append(f"evaluations: {count} x {facts.eval_rows:,} rows, forward only: {seconds:,.1f} s")
    return seconds


def _answers(shape: Shape, job: dict[str, Any], facts: Facts, forward: float, read: float, rates: Rates,
             basis: list[str]) -> float | None:
    """Answers before and after training, and the held-out rows' losses (worker/train/evaluation.py)."""
    evaluating = float(job.get("eval_steps") or 0) > 0 and facts.eval_rows is not None
    answered = min(int(job.get("eval_generate_rows") or 0), facts.eval_rows or 0) if evaluating else 0
    prompts = len(job.get("sample_prompts") or ())
    scored = min(facts.eval_rows or 0, max(SCORED_ROWS, answered)) if evaluating else 0
    if not (answered or prompts or scored):
        return None
    per_token = DECODE_TOKEN_S + shape.layers * DECODE_LAYER_S + read / rates.bytes_per_s
    # a held-out answer runs to twice its reference's length, at most; a reference is about half a row
    tokens = prompts * SAMPLE_TOKENS + math.ceil(answered / ANSWER_BATCH) * min(MAX_NEW_TOKENS, facts.row_tokens + 8)
    seconds = 2 * (tokens * per_token + (_pass_seconds(scored, LOSS_BATCH, facts, forward, rates) if scored else 0))
    basis.append(f"answers before and after: {prompts} prompts and {answered} held-out rows, ~{tokens:,.0f} tokens "
                 f"each time at {per_token * 1000:,.0f} ms a token (the weights read once a token), and {scored} rows' "
                 f"losses: {seconds:,.1f} s")
    return seconds


def measured_from(job_id: str, model_name: str, job: dict[str, Any], config: dict[str, Any] | None,
                  records: Sequence[dict[str, Any]], wall_seconds: float | None,
                  eval_rows: int | None) -> Measured | None:
    """A finished job's figures from its metric records (one per logged step; eval-only records have no loss):
    its steps' time without the evaluations between them, its tokens a row. wall_seconds: start to end (None: a
    stopped job, whose rest is not a whole job's). None when it logged no timed step."""
    steps_time, previous, last = 0.0, None, None
    for record in records:
        elapsed = record.get("elapsed_seconds")
        if not isinstance(elapsed, (int, float)) or record.get("step", 0) <= 0:
            continue  # the base model's evaluation is logged at step 0, before the clock of the steps starts
        if record.get("loss") is not None:
            steps_time += elapsed - (previous or 0.0)
            last = record
        previous = elapsed
    if last is None or steps_time <= 0:
        return None
    steps = int(last["step"])
    tokens = last.get("num_tokens")
    per_row = (tokens / (steps * int(job["batch_size"]) * int(job["gradient_accumulation_steps"])
                         * _rows_per_example(job)) if isinstance(tokens, (int, float)) and tokens > 0 else None)
    rest = wall_seconds - steps_time if wall_seconds is not None and wall_seconds > steps_time else None
    return Measured(job_id, model_name, str(job["training_type"]), str(job.get("method", "sft")), config,
                    {**job, "max_steps": steps}, steps, steps_time, per_row, eval_rows, rest)


def _ratios(m: Measured, rates: Rates) -> tuple[float | None, float | None]:
    """(steps, rest): what the job measured over what the formula says of it."""
    if m.config is None:
        return None, None
    try:
        parts = formula(m.config, m.job, Facts.of(m.job, {"tokens_per_row": m.tokens_per_row,
                                                          "eval_rows": m.eval_rows}), rates)
    except (ValueError, KeyError, TypeError):  # a config.json that changed shape since
        return None, None
    step = m.step_seconds / (m.steps * parts.step) if parts.step > 0 else None
    evaluated = float(m.job.get("eval_steps") or 0) > 0
    rest = m.rest_seconds / parts.rest if m.rest_seconds is not None and parts.rest > 0 and (
        m.eval_rows is not None or not evaluated) else None
    return step, rest


def _learned(job: dict[str, Any], measured: Sequence[Measured], rates: Rates
             ) -> tuple[str, float | None, float | None, list[Measured], list[Measured]]:
    """(kind, step factor, rest factor, the jobs each came from), the same model's jobs first, then others'."""
    same = [m for m in measured if m.model_name == job.get("model_name") and m.training_type == str(job[
        "training_type"]) and m.method == str(job.get("method", "sft"))]
    for kind, group in (("measured", same), ("scaled", [m for m in measured if m not in same])):
        ratios = [(m, *_ratios(m, rates)) for m in group]
        steps = [(m, s) for m, s, _ in ratios if s][:MEASURED_JOBS]
        rests = [(m, r) for m, _, r in ratios if r][:MEASURED_JOBS]
        if steps or rests:
            return (kind, statistics.median(s for _, s in steps) if steps else None,
                    statistics.median(r for _, r in rests) if rests else None,
                    [m for m, _ in steps], [m for m, _ in rests])
    return "arithmetic", None, None, [], []


def time_job(config: dict[str, Any], job: dict[str, Any], dataset: dict[str, Any], machine: dict[str, Any],
             calibrated: tuple[float, str] | None, measured: Sequence[Measured]) -> Timing:
    """The job's time: the formula's parts, each corrected by this machine's finished jobs where it can be."""
    rates = Rates.of(machine)
    facts = Facts.of(job, dataset)
    parts = formula(config, job, facts, rates)
    kind, step_factor, rest_factor, by_steps, by_rest = _learned(job, measured, rates)
    basis = [_tokens_line(job, facts)]
    if facts.steps is not None:
        basis.append(f"{facts.steps:,} steps" + ("" if job.get("max_steps") else
                                                 f": {job.get('num_epochs')} epochs of {facts.rows} rows"))
    step, source, step_line = _step(parts, facts, job, config, rates, kind, step_factor, by_steps, calibrated)
    basis.append(step_line)
    basis.extend(parts.basis)
    scale = rest_factor if rest_factor is not None else 1.0
    if rest_factor is not None:
        basis.append(f"evaluations, answers, loading and saving x {rest_factor:.2f}: what job "
                     f"{', '.join(m.job_id for m in by_rest)} ({'this' if kind == 'measured' else 'another'} model) "
                     "took beside its steps on this machine, over the formula's figure for it")
    notes = [step_line] if source != "arithmetic" else []
    if facts.steps is None:
        basis.append("the total needs max_steps or the dataset's rows (run the dataset report)")
        return Timing(step, int(facts.step_tokens), source, facts.per_row, None, None, None, None, None, None,
                      basis, notes)
    evaluation = None if parts.evaluation is None else parts.evaluation * scale
    generation = None if parts.generation is None else parts.generation * scale
    other, train = parts.other * scale, facts.steps * step
    total = train + (evaluation or 0.0) + (generation or 0.0) + other
    return Timing(step, int(facts.step_tokens), source, facts.per_row, facts.steps, train, evaluation, generation,
                  other, total, basis, notes)


def _tokens_line(job: dict[str, Any], facts: Facts) -> str:
    return (f"{facts.step_tokens:,.0f} tokens a step: batch {job['batch_size']} x accumulation "
            f"{job['gradient_accumulation_steps']} x "
            + (f"{facts.per_row:,.0f} tokens a row (the dataset report's mean, cut at max_seq_length)" if facts.per_row
               else f"max_seq_length {job['max_seq_length']} (every row full; the dataset report gives the real "
                    "lengths)"))


def _step(parts: Parts, facts: Facts, job: dict[str, Any], config: dict[str, Any], rates: Rates, kind: str,
          factor: float | None, by: list[Measured], calibrated: tuple[float, str] | None) -> tuple[float, str, str]:
    """Seconds a step, its source, and what it rests on."""
    said = f"{parts.step:,.3f} s a step by the formula"
    if factor is not None and kind == "measured":
        return parts.step * factor, "measured", (
            f"{said} x {factor:.2f}: what job {', '.join(m.job_id for m in by)} (this model, {job['training_type']}, "
            f"{job.get('method', 'sft')}) measured a step on this machine, over the formula's figure for it")
    if calibrated is not None:
        seconds = calibrated[0] * int(job["gradient_accumulation_steps"]) * facts.row_tokens / int(
            job["max_seq_length"])
        return seconds, "calibration", calibrated[1]
    if factor is not None:
        return parts.step * factor, "scaled", (
            f"{said} x {factor:.2f}: what job {', '.join(m.job_id for m in by)} (another model) measured a step on "
            "this machine, over the formula's figure for it")
    cost = flops_per_token(config, str(job["training_type"]))
    return parts.step, "arithmetic", (
        f"no job has run on this machine yet: a step is {STEP_S * 1000:.0f} ms of fixed cost and "
        f"{cost / 1e6:,.0f} MFLOP a token at an assumed {rates.flops / 1e9:,.0f} GFLOP/s ({rates.name})")
