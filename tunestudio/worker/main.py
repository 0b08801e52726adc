"""One job's life inside the worker process, top to bottom.

load config → load tokenizer and model → prepare (LoRA / QLoRA / full) →
load and format the dataset → build the trainer → sample the base model →
train → save → sample the result → report.

Every way out ends in exactly one terminal event: `Completed` (possibly
stopped) or `Failed`. A `UserError` is reported by its message alone; running
out of memory or a full disk by what to change (worker/errors.py); anything
else is a bug and carries the traceback for the logs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tunestudio import ownership, paths
from tunestudio.config import METHOD_SPECS, JobConfig, format_validation_error, summary
from tunestudio.events import EVAL_ROWS_FILE, HELD_OUT_FILE, HeldOut, Sample
from tunestudio.worker import errors
from tunestudio.worker.channel import Channel, quiet_libraries
from tunestudio.worker.errors import UserError, disk_full, out_of_memory
from tunestudio.worker.phases import Steps
from tunestudio.worker.train import end_open_runs


def run(
    config: JobConfig | dict[str, Any], channel: Channel, secrets: dict[str, str] | None = None,
    cache_dir: str | None = None,
) -> int:
    """Run one job to its end; returns the process exit code (0 completed or stopped, 1 failed).

    cache_dir: where measured decisions (the precision of `auto`) are kept between jobs.
    """
    cfg: JobConfig | None = None
    try:
        cfg = _validate(config, secrets)
        quiet_libraries()
        code = _train(cfg, channel, Path(cache_dir) if cache_dir else None)
        end_open_runs("KILLED")  # an MLflow run a stop before training left open
        return code
    except UserError as exc:
        channel.failed(str(exc), traceback.format_exc())
    except Exception as exc:
        oom = out_of_memory(exc, cfg, _peak_memory_mb()) if cfg is not None else None
        if oom is not None:
            channel.failed(oom, traceback.format_exc())
        elif disk_full(exc):  # the library's own words (torch's inline_container.cc...) go to the log only
            where = f" (output_dir {cfg.output_dir})" if cfg is not None and cfg.output_dir else ""
            channel.failed(f"disk full: writing a file failed{where}; free some space, then resume the job from "
                           "its last checkpoint", traceback.format_exc())
        else:
            channel.failed(f"{type(exc).__name__}: {exc}", traceback.format_exc())
    end_open_runs("FAILED")
    return 1


def _peak_memory_mb() -> float | None:
    """The process's peak memory, when torch is loaded already (not worth importing it for a message)."""
    if "torch" not in sys.modules:
        return None
    try:
        from tunestudio.worker.train import peak_memory_mb

        return peak_memory_mb()
    except Exception:  # a CUDA context broken by the failure itself: the message goes without the figure
        return None


def _validate(config: JobConfig | dict[str, Any], secrets: dict[str, str] | None) -> JobConfig:
    """The job as the recipe runs it. A typed JobConfig (a local worker: the one the manager validated and resolved
    at submit) is taken as it is; a dict (a rank under torchrun or Ray, a worker run by hand) is validated here.
    Either way its paths are checked again, the one thing that can change between submit and start (an input
    deleted meanwhile): `paths.resolve` of a resolved config changes nothing else."""
    try:
        cfg = config if isinstance(config, JobConfig) else JobConfig.from_parts(config, secrets)
        return paths.resolve(cfg)
    except ValidationError as exc:
        raise UserError(f"invalid config: {summary(format_validation_error(exc))}") from None
    except paths.PathRefused as exc:
        raise UserError(str(exc)) from None


def _train(cfg: JobConfig, channel: Channel, cache_dir: Path | None) -> int:
    if not cfg.output_dir:
        raise UserError("output_dir: the worker needs an output folder")
    output_dir = Path(cfg.output_dir)
    standalone = not (output_dir / ownership.MARKER).is_file() and channel.is_main
    try:  # the manager took the folder (tunestudio.ownership); a worker run by hand takes it itself
        if standalone:
            ownership.take(output_dir, "standalone")
    except ownership.NotOurs as exc:
        raise UserError(f"output_dir: {exc}") from None
    try:
        return _train_in(cfg, channel, cache_dir, output_dir)
    finally:  # a worker run by hand seals its own claim, and gives the folder back if it wrote nothing
        if standalone and not ownership.seal(output_dir, "standalone"):
            ownership.release(output_dir, "standalone")


@dataclasses.dataclass
class _Run:
    """One job's state as the recipe's steps hand it on: what each step made, for the steps after it."""

    cfg: JobConfig
    channel: Channel
    output_dir: Path
    cache_dir: Path | None
    modality: Any = None  # worker/modalities: the job's kind of data
    processor: Any = None  # what the trainer tokenises with (a tokenizer for text)
    model: Any = None
    precision: Any = None
    gradient_checkpointing: bool = False
    known: Any = None  # precision auto, measured by an earlier job (worker/train/calibrate.py)
    data: Any = None
    held_eval: Any = None  # the converted held-out rows, as they were split (the trainer's copy is tokenised)
    held_out: HeldOut | None = None
    trainer: Any = None
    reporter: Any = None
    tracking_run: Any = None
    steps: Steps | None = None
    evaluator: Any = None
    # what the worker decided for the job where the config left it a choice (the Completed event's `resolved`)
    resolved: dict[str, str] = dataclasses.field(default_factory=dict)
    before: list[str] = dataclasses.field(default_factory=list)


def _train_in(cfg: JobConfig, channel: Channel, cache_dir: Path | None, output_dir: Path) -> int:
    from tunestudio.worker import modalities
    from tunestudio.worker.train import resolve_checkpoint

    cfg, note = modalities.detected(cfg)
    if note:
        channel.log(note)
    job = _Run(cfg, channel, output_dir, cache_dir, modality=modalities.for_job(cfg))
    checkpoint = resolve_checkpoint(cfg)
    _load_model(job)  # 1. processor and model, prepared for LoRA / QLoRA / full
    if channel.stop_request:
        return _stopped_before_training(channel)
    _load_data(job)  # 2. dataset: read, format (through the chat template), check, split
    _build_trainer(job)  # 3. the trainer, its precision measured, its logging integrations
    if channel.stop_request:
        return _stopped_before_training(channel)
    if not _measure_base(job, checkpoint):  # 4. the base model, for comparison afterwards
        return _stopped_before_training(channel)
    channel.phase("training")  # 5. train
    result = job.trainer.train(resume_from_checkpoint=checkpoint)
    _describe_batches(job, after_training=True)
    stop = job.reporter.stop
    if stop is not None and not stop.save:
        if job.tracking_run is not None:
            job.tracking_run.end("KILLED")
        channel.completed(output_dir=None, stopped=True, saved=False, global_step=job.trainer.state.global_step)
        return 0
    saved_checkpoint, weights_step = _save(job, stop is not None)  # 6. save
    if not channel.is_main:
        return 0  # under torchrun, rank 0 writes the rest and reports
    _report(job, result, stop, saved_checkpoint, weights_step)  # 7. the result
    return 0


def _load_model(job: _Run) -> None:
    from tunestudio.worker.train import (
        cached,
        configure_allocator,
        configure_threads,
        count_4bit_layers,
        count_parameters,
        hidden_size,
        precision_named,
        prepare_model,
        resolve_gradient_checkpointing,
        resolve_precision,
    )

    cfg, channel = job.cfg, job.channel
    channel.phase("loading_model", f"loading {cfg.model_name}")
    configure_allocator()  # before the model's weights and the first step allocate (performance.py says why)
    threads = configure_threads()
    job.precision = resolve_precision(cfg, hidden_size(cfg))
    # precision auto, measured by an earlier job (worker/train/calibrate.py): in force from the start, one process
    # only
    job.known = cached(cfg, job.cache_dir) if int(os.environ.get("WORLD_SIZE", "1")) == 1 else None
    if job.known is not None:
        job.precision = precision_named(job.known.precision)
    job.processor = job.modality.load_processor(cfg)
    model = job.modality.load_model(cfg, job.precision.compute_dtype)
    job.gradient_checkpointing = resolve_gradient_checkpointing(cfg, channel, model, job.precision)
    errors.decided["gradient_checkpointing"] = job.gradient_checkpointing
    # the adapters' first weights come from the job's seed: the trainer seeds only when it is built, after them, and a
    # fresh process's torch starts from a seed of its own, so two runs of one job began from different adapters
    from transformers import set_seed

    set_seed(cfg.random_seed)
    job.model = prepare_model(model, cfg, job.gradient_checkpointing)
    trainable, total = count_parameters(job.model)
    four_bit = count_4bit_layers(job.model)
    channel.log(
        f"model: {total:,} parameters, {trainable:,} trainable ({cfg.training_type.value}, {job.precision.name}"
        + (f", {four_bit} 4-bit layers" if four_bit else "") + f", {threads} threads)"
    )
    job.resolved["gradient_checkpointing"] = "on" if job.gradient_checkpointing else "off"
    adapted = [name for name, module in job.model.named_modules() if hasattr(module, "lora_A")]
    if adapted:  # the layers that got adapters, as peft wrapped them
        from tunestudio.worker.train import describe_targets

        kinds = sorted({name.rsplit(".", 1)[-1] for name in adapted})
        job.resolved["lora_targets"] = f"{len(adapted)} layers ({', '.join(kinds)})" + (
            f": {describe_targets(adapted)}" if cfg.modality == "image" else "")
        if cfg.modality == "image":
            channel.log(f"LoRA targets (finetune_vision_layers {cfg.finetune_vision_layers}, language "
                        f"{cfg.finetune_language_layers}, attention {cfg.finetune_attention_modules}, mlp "
                        f"{cfg.finetune_mlp_modules}): {describe_targets(adapted)}")
    if cfg.modality == "image" and getattr(job.processor, "tunestudio_notes", None):
        job.resolved["images"] = "; ".join(job.processor.tunestudio_notes).removeprefix("images: ")
    if cfg.modality == "audio" and getattr(job.processor, "tunestudio_notes", None):
        job.resolved["audio"] = "; ".join(job.processor.tunestudio_notes).removeprefix("audio: ")


def _load_data(job: _Run) -> None:
    from tunestudio.worker.data import write_held_out

    job.channel.phase("loading_dataset")
    job.data = job.modality.prepare_data(job.cfg, job.processor, Steps(job.channel).counter(
        "loading_dataset", "rows read and checked"))
    # conversations reach the trainer tokenised; the evaluator reads them as conversations
    job.held_eval = job.data.eval_examples if job.data.eval_examples is not None else job.data.eval
    for note in job.data.notes:
        job.channel.log(note)
    for warning in job.data.warnings:
        job.channel.warn(warning)
    held = job.data.held_out
    if held is not None and job.channel.is_main:  # which rows, before training: a resume of any end reuses it
        held_file = job.output_dir / HELD_OUT_FILE
        write_held_out(held_file, held)
        job.held_out = HeldOut(file=str(held_file), rows=len(held["rows"]), seed=held["seed"], source=held["source"])


def _build_trainer(job: _Run) -> None:
    import torch

    from tunestudio.worker.train import ChoosingCollator, build_trainer, precision_named
    from tunestudio.worker.train import callback as mlflow_callback
    from tunestudio.worker.train import for_job as calibrate
    from tunestudio.worker.train import install as install_lm_head
    from tunestudio.worker.train import job_run as mlflow_run
    from tunestudio.worker.train import setup as setup_integrations

    cfg, channel = job.cfg, job.channel
    report_to, integration_notes = setup_integrations(cfg)
    for note in integration_notes:
        channel.log(note)
    job.tracking_run = mlflow_run(cfg) if channel.is_main else None  # report_to mlflow: its run, its params
    if job.tracking_run is not None:
        channel.log(f"mlflow: run {job.tracking_run.run_id} in experiment {cfg.mlflow_experiment!r} of "
                    f"{job.tracking_run.uri}")
    if install_lm_head() and not torch.cuda.is_available():
        channel.log("LM head: TRL's fused log-probabilities computed by worker/train/lmhead.py on the CPU "
                    "(the same values, in a few passes per chunk of tokens)")

    def build() -> None:
        job.trainer, job.reporter = build_trainer(
            cfg, job.model, job.processor, job.data, job.precision, job.gradient_checkpointing, channel, report_to)

    build()
    # precision auto: measured on this model and a batch of this data (worker/train/calibrate.py); one process
    # only, so that every rank of a data-parallel job keeps the precision it was given
    decision = job.known or (calibrate(cfg, job.trainer, job.cache_dir)
                             if job.trainer.args.world_size == 1 else None)
    if decision is not None:
        channel.log(decision.describe())
        job.resolved["precision"] = f"{decision.precision} (auto: {decision.reason})"
        if decision.precision != job.precision.name:
            job.precision = precision_named(decision.precision)
            job.data = dataclasses.replace(job.data, train=job.trainer.train_dataset,
                                           eval=job.trainer.eval_dataset or job.data.eval)
            build()
    if isinstance(job.trainer.data_collator, ChoosingCollator):
        job.trainer.data_collator.reset()  # the batches calibration drew are not the job's
    if job.tracking_run is not None:  # after early stopping's: its generation metrics are logged
        job.trainer.add_callback(mlflow_callback(job.tracking_run))
    _describe_batches(job)
    world = job.trainer.args.world_size
    if world > 1:
        channel.log(
            f"data parallel: {world} ranks ({'nccl' if job.trainer.args.n_gpu else 'gloo'}), "
            f"global batch {cfg.batch_size * cfg.gradient_accumulation_steps * world} "
            f"({cfg.batch_size} per rank x {cfg.gradient_accumulation_steps} accumulation)"
        )


def _describe_batches(job: _Run, after_training: bool = False) -> None:
    """How batches are made (after training: how many were flattened, if it chose), when there is something to
    say."""
    from tunestudio.worker.train import ChoosingCollator
    from tunestudio.worker.train import describe as describe_batches

    collator = job.trainer.data_collator
    if after_training and not (isinstance(collator, ChoosingCollator) and collator.batches):
        return
    batches = describe_batches(job.trainer, job.cfg.padding_free)
    if batches:
        job.channel.log(batches)


def _measure_base(job: _Run, checkpoint: str | None) -> bool:
    """The sample prompts, the eval loss and the held-out answers of the base model (by the one process that
    reports), each a step of its own (worker/phases.py) with how far it is; False when a stop came meanwhile."""
    cfg, channel, trainer, modality = job.cfg, job.channel, job.trainer, job.modality
    job.steps = steps = Steps(channel)
    if channel.is_main:
        job.before = steps.each("generating_base", "the base model answers the sample prompts", cfg.sample_prompts,
                                lambda p: modality.generate(trainer.model, job.processor, p))
    loss_before = None
    if trainer.eval_dataset is not None and checkpoint is None:  # eval loss at step 0, reported through the callback
        loss_before = steps.evaluate(trainer, "evaluating_base", "eval loss of the base model").get("eval_loss")
    held = job.held_eval if trainer.eval_dataset is not None else None
    if METHOD_SPECS[cfg.method].trainer == "reward":  # a score head generates nothing: its pairs are scored
        from tunestudio.worker.train import RewardEvaluator

        job.evaluator = RewardEvaluator.for_job(held, cfg.eval_generate_rows, cfg.max_seq_length)
    else:
        job.evaluator = modality.evaluator(held, cfg.eval_generate_rows, job.data.eval_places, cfg.max_seq_length)
    if job.evaluator is None:
        return True
    if job.evaluator.rows:
        channel.log(f"evaluation: the base model answers {len(job.evaluator.rows)} held-out rows")
    return job.evaluator.answer_before(
        trainer.model, job.processor, loss_before, lambda: channel.stop_request is not None,
        steps.counter("generating_base", "the base model answers held-out rows"))


def _save(job: _Run, stopped: bool) -> tuple[str | None, int]:
    """The weights (every rank calls the trainer's save; it writes on rank 0), then rank 0's processor, resolved
    config and metrics; (the checkpoint a stop saved, the step whose weights were saved)."""
    from tunestudio.worker.train import stopper_of

    job.channel.phase("saving")
    output_dir, trainer = job.output_dir, job.trainer
    saved_checkpoint = _latest_checkpoint(output_dir) if stopped else None
    # keep_best: the best step's weights back into the model (every rank), for the artefacts and the evaluation
    stopper = stopper_of(trainer)
    weights_step = stopper.restore_best(trainer) if stopper is not None else trainer.state.global_step
    trainer.save_model(str(output_dir))
    if not job.channel.is_main:
        return saved_checkpoint, weights_step
    job.processor.save_pretrained(str(output_dir))
    (output_dir / "job_config.json").write_text(json.dumps(job.cfg.public_dict(), indent=2) + "\n")
    with (output_dir / "metrics.jsonl").open("w", encoding="utf-8") as fh:
        for record in job.reporter.records:
            fh.write(json.dumps(record) + "\n")
    return saved_checkpoint, weights_step


def _report(job: _Run, result: Any, stop: Any, saved_checkpoint: str | None, weights_step: int) -> None:
    """The fine-tuned model's samples and evaluation, the job's run closed, and the Completed event."""
    from tunestudio.worker.train import finish as finish_mlflow_run
    from tunestudio.worker.train import stopper_of

    cfg, trainer, steps = job.cfg, job.trainer, job.steps
    assert steps is not None
    after = steps.each("generating", "the fine-tuned model answers the sample prompts", cfg.sample_prompts,
                       lambda p: job.modality.generate(trainer.model, job.processor, p))
    samples = [Sample(prompt=p, before=b, after=a) for p, b, a in zip(cfg.sample_prompts, job.before, after,
                                                                       strict=True)]
    evaluation = None
    if job.evaluator is not None and stop is None:  # a stopped job is not judged: the stop asked for a quick end
        evaluation = job.evaluator.result(trainer.model, job.processor,
                                          _final_eval_loss(trainer, job.reporter.records, weights_step, steps),
                                          steps.counter("generating", "the fine-tuned model answers held-out rows"),
                                          rows_file=job.output_dir / EVAL_ROWS_FILE)
    metrics = {k: float(v) for k, v in result.metrics.items() if isinstance(v, (int, float))}
    if cfg.dedupe != "off":
        metrics["dedupe_removed"] = float(job.data.deduplicated)  # the job's summary (final_metrics) says how many
    stopper = stopper_of(trainer)  # early stopping's watch, if the job has one
    best = stopper.best() if stopper is not None else None
    reason = stopper.reason if stopper is not None else ""
    if job.tracking_run is not None:
        finish_mlflow_run(job.tracking_run, stopped=stop is not None, output_dir=str(job.output_dir), metrics=metrics,
                        evaluation=evaluation, best=best, reason=reason)
    job.channel.completed(
        output_dir=str(job.output_dir), stopped=stop is not None, saved=True, checkpoint=saved_checkpoint,
        global_step=trainer.state.global_step, metrics=metrics, samples=samples, evaluation=evaluation, best=best,
        reason=reason, held_out=job.held_out, resolved={"precision": job.precision.name, **job.resolved},
    )


def _final_eval_loss(trainer: Any, records: list[dict[str, Any]], step: int, steps: Steps) -> float | None:
    """The eval loss of the model's weights, those of `step`: the trainer's evaluation at that step, else a new one."""
    for record in reversed(records):
        if record.get("eval_loss") is not None and record["step"] == step:
            return record["eval_loss"]
    return steps.evaluate(trainer, "evaluating", "eval loss of the fine-tuned model").get("eval_loss")


def _stopped_before_training(channel: Channel) -> int:
    channel.completed(output_dir=None, stopped=True, saved=False)
    return 0


def _latest_checkpoint(output_dir: Path) -> str | None:
    from tunestudio.checkpoints import latest_checkpoint

    return latest_checkpoint(output_dir)
