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
from tunestudio.config import JobConfig, format_validation_error, summary
from tunestudio.events import EVAL_ROWS_FILE, HELD_OUT_FILE, HeldOut, Sample
from tunestudio.worker import errors, tracking
from tunestudio.worker.channel import Channel, quiet_libraries
from tunestudio.worker.errors import UserError, disk_full, out_of_memory
from tunestudio.worker.phases import Steps


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
        tracking.end_open_runs("KILLED")  # an MLflow run a stop before training left open
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
    tracking.end_open_runs("FAILED")
    return 1


def _peak_memory_mb() -> float | None:
    """The process's peak memory, when torch is loaded already (not worth importing it for a message)."""
    if "torch" not in sys.modules:
        return None
    try:
        from tunestudio.worker.performance import peak_memory_mb

        return peak_memory_mb()
    except Exception:  # a CUDA context broken by the failure itself: the message goes without the figure
        return None


def _validate(config: JobConfig | dict[str, Any], secrets: dict[str, str] | None) -> JobConfig:
    """The config validated again, its paths checked again: the worker may start long after the submit."""
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


def _train_in(cfg: JobConfig, channel: Channel, cache_dir: Path | None, output_dir: Path) -> int:
    import torch

    from tunestudio.worker import batching, calibrate, integrations, lmhead, performance
    from tunestudio.worker import best as best_mod
    from tunestudio.worker import data as data_mod
    from tunestudio.worker import evaluation as evaluation_mod
    from tunestudio.worker import model as model_mod
    from tunestudio.worker import train as train_mod
    from tunestudio.worker.data import held_out as held_out_mod

    checkpoint = train_mod.resolve_checkpoint(cfg)

    # 1. tokenizer and model
    channel.phase("loading_model", f"loading {cfg.model_name}")
    threads = performance.configure_threads()
    precision = train_mod.resolve_precision(cfg, model_mod.hidden_size(cfg))
    # precision auto, measured by an earlier job (worker/calibrate.py): in force from the start, one process only
    known = calibrate.cached(cfg, cache_dir) if int(os.environ.get("WORLD_SIZE", "1")) == 1 else None
    if known is not None:
        precision = train_mod.precision_named(known.precision)
    tokenizer = model_mod.load_tokenizer(cfg)
    model = model_mod.load_model(cfg, precision.compute_dtype)
    gradient_checkpointing = train_mod.resolve_gradient_checkpointing(cfg, channel, model, precision)
    errors.decided["gradient_checkpointing"] = gradient_checkpointing
    model = model_mod.prepare_model(model, cfg, gradient_checkpointing)
    trainable, total = model_mod.count_parameters(model)
    four_bit = model_mod.count_4bit_layers(model)
    channel.log(
        f"model: {total:,} parameters, {trainable:,} trainable ({cfg.training_type.value}, {precision.name}"
        + (f", {four_bit} 4-bit layers" if four_bit else "") + f", {threads} threads)"
    )
    if channel.stop_request:
        return _stopped_before_training(channel)

    # 2. dataset: read, format (through the tokenizer's chat template), check, split
    channel.phase("loading_dataset")
    data = data_mod.prepare(cfg, tokenizer)
    for note in data.notes:
        channel.log(note)
    for warning in data.warnings:
        channel.warn(warning)
    held_out = None
    if data.held_out is not None and channel.is_main:  # which rows, before training: a resume of any end reuses it
        held_file = output_dir / HELD_OUT_FILE
        held_out_mod.write(held_file, data.held_out)
        held_out = HeldOut(file=str(held_file), rows=len(data.held_out["rows"]), seed=data.held_out["seed"],
                           source=data.held_out["source"])

    held_eval = data.eval  # the converted held-out rows, as they were split (the trainer's copy is tokenised)

    # 3. trainer, with the logging integrations the job asked for
    report_to, integration_notes = integrations.setup(cfg)
    for note in integration_notes:
        channel.log(note)
    run = tracking.job_run(cfg) if channel.is_main else None  # report_to mlflow: the job's run, its params
    if run is not None:
        channel.log(f"mlflow: run {run.run_id} in experiment {cfg.mlflow_experiment!r} of {run.uri}")
    if lmhead.install() and not torch.cuda.is_available():
        channel.log("LM head: TRL's fused log-probabilities computed by worker/lmhead.py on the CPU "
                    "(the same values, in a few passes per chunk of tokens)")
    trainer, reporter = train_mod.build_trainer(
        cfg, model, tokenizer, data, precision, gradient_checkpointing, channel, report_to
    )
    # precision auto: measured on this model and a batch of this data (worker/calibrate.py); one process only,
    # so that every rank of a data-parallel job keeps the precision it was given
    decision = known or (calibrate.for_job(cfg, trainer, cache_dir) if trainer.args.world_size == 1 else None)
    if decision is not None:
        channel.log(decision.describe())
        if decision.precision != precision.name:
            precision = train_mod.precision_named(decision.precision)
            data = dataclasses.replace(data, train=trainer.train_dataset, eval=trainer.eval_dataset or data.eval)
            trainer, reporter = train_mod.build_trainer(
                cfg, model, tokenizer, data, precision, gradient_checkpointing, channel, report_to
            )
    if isinstance(trainer.data_collator, batching.ChoosingCollator):
        trainer.data_collator.reset()  # the batches calibration drew are not the job's
    if run is not None:
        trainer.add_callback(tracking.callback(run))  # after early stopping's: its generation metrics are logged
    batches = batching.describe(trainer, cfg.padding_free)
    if batches:
        channel.log(batches)
    if trainer.args.world_size > 1:
        channel.log(
            f"data parallel: {trainer.args.world_size} ranks ({'nccl' if trainer.args.n_gpu else 'gloo'}), "
            f"global batch {cfg.batch_size * cfg.gradient_accumulation_steps * trainer.args.world_size} "
            f"({cfg.batch_size} per rank x {cfg.gradient_accumulation_steps} accumulation)"
        )
    if channel.stop_request:
        return _stopped_before_training(channel)

    # 4. the base model, for comparison afterwards (by the one process that reports): the sample prompts,
    # the eval loss, held-out answers; each a step of its own (worker/phases.py), with how far it is
    steps = Steps(channel)
    before = steps.each("generating_base", "the base model answers the sample prompts", cfg.sample_prompts,
                        lambda p: train_mod.generate(trainer.model, tokenizer, p)) if channel.is_main else []
    loss_before = None
    if trainer.eval_dataset is not None and checkpoint is None:  # eval loss at step 0, reported through the callback
        loss_before = steps.evaluate(trainer, "evaluating_base", "eval loss of the base model").get("eval_loss")
    evaluator = evaluation_mod.Evaluator.for_job(held_eval if trainer.eval_dataset is not None else None,
                                                 cfg.eval_generate_rows, data.eval_places, cfg.max_seq_length)
    if evaluator is not None and evaluator.rows:
        channel.log(f"evaluation: the base model answers {len(evaluator.rows)} held-out rows")
    if evaluator is not None and not evaluator.answer_before(
        trainer.model, tokenizer, loss_before, lambda: channel.stop_request is not None,
        steps.counter("generating_base", "the base model answers held-out rows"),
    ):
        return _stopped_before_training(channel)

    # 5. train
    channel.phase("training")
    result = trainer.train(resume_from_checkpoint=checkpoint)
    collator = trainer.data_collator
    if isinstance(collator, batching.ChoosingCollator) and collator.batches:  # how many batches were flattened
        channel.log(batching.describe(trainer, cfg.padding_free))
    stop = reporter.stop
    stopper = best_mod.stopper_of(trainer)  # early stopping's watch, if the job has one
    if stop is not None and not stop.save:
        if run is not None:
            run.end("KILLED")
        channel.completed(output_dir=None, stopped=True, saved=False, global_step=trainer.state.global_step)
        return 0

    # 6. save
    channel.phase("saving")
    saved_checkpoint = _latest_checkpoint(output_dir) if stop is not None else None
    # keep_best: the best step's weights back into the model (every rank), for the artefacts and the evaluation
    weights_step = stopper.restore_best(trainer) if stopper is not None else trainer.state.global_step
    trainer.save_model(str(output_dir))  # every rank calls it; the trainer writes on rank 0 only
    if not channel.is_main:
        return 0  # under torchrun, rank 0 writes the rest and reports
    tokenizer.save_pretrained(str(output_dir))
    (output_dir / "job_config.json").write_text(json.dumps(cfg.public_dict(), indent=2) + "\n")
    with (output_dir / "metrics.jsonl").open("w", encoding="utf-8") as fh:
        for record in reporter.records:
            fh.write(json.dumps(record) + "\n")

    # 7. the result
    after = steps.each("generating", "the fine-tuned model answers the sample prompts", cfg.sample_prompts,
                       lambda p: train_mod.generate(trainer.model, tokenizer, p))
    samples = [Sample(prompt=p, before=b, after=a) for p, b, a in zip(cfg.sample_prompts, before, after, strict=True)]
    evaluation = None
    if evaluator is not None and stop is None:  # a stopped job is not judged: the stop asked for a quick end
        evaluation = evaluator.result(trainer.model, tokenizer,
                                      _final_eval_loss(trainer, reporter.records, weights_step, steps),
                                      steps.counter("generating", "the fine-tuned model answers held-out rows"),
                                      rows_file=output_dir / EVAL_ROWS_FILE)
    metrics = {k: float(v) for k, v in result.metrics.items() if isinstance(v, (int, float))}
    if cfg.dedupe != "off":
        metrics["dedupe_removed"] = float(data.deduplicated)  # the job's summary (final_metrics) says how many
    best = stopper.best() if stopper is not None else None
    if run is not None:
        tracking.finish(run, stopped=stop is not None, output_dir=str(output_dir), metrics=metrics,
                        evaluation=evaluation, best=best, reason=stopper.reason if stopper is not None else "")
    channel.completed(
        output_dir=str(output_dir),
        stopped=stop is not None,
        saved=True,
        checkpoint=saved_checkpoint,
        global_step=trainer.state.global_step,
        metrics=metrics,
        samples=samples,
        evaluation=evaluation,
        best=best,
        reason=stopper.reason if stopper is not None else "",
        held_out=held_out,
    )
    return 0


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
