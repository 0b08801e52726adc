"""Building TRL's SFTTrainer from a JobConfig (the other methods' trainers: methods.py),
and the callback that reports progress and obeys stop commands at step boundaries."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from trl import SFTConfig, SFTTrainer

from tunestudio.checkpoints import is_complete, latest_checkpoint
from tunestudio.config import JobConfig, reward_name
from tunestudio.events import Progress, Stop
from tunestudio.paths import expand
from tunestudio.worker.channel import Channel
from tunestudio.worker.data import PreparedData
from tunestudio.worker.errors import UserError
from tunestudio.worker.optional import BNB_OPTIMIZERS
from tunestudio.worker.train import batching, memory, methods, performance, reward_signal
from tunestudio.worker.train.best import EarlyStopper
from tunestudio.worker.train.checkpointing import save_checkpoints_atomically


@dataclass(frozen=True)
class Precision:
    bf16: bool
    fp16: bool
    compute_dtype: torch.dtype
    name: str


def resolve_precision(cfg: JobConfig, hidden_size: int | None = None) -> Precision:
    """The mixed-precision flags, set explicitly (SFTConfig turns bf16 on by default, even on CPU).

    auto: provisional; worker/train/calibrate.py measures and may change it before training (a GPU starts
    from bf16, or fp16 without bf16; a CPU from fp32; QLoRA on a CPU keeps performance.py's rule).
    """
    cuda = torch.cuda.is_available()
    choice = cfg.precision
    if choice == "auto":
        if cuda:
            choice = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        elif cfg.training_type.value == "qlora":  # its compute dtype is fixed at load: the rule decides
            choice = "bf16" if performance.cpu_prefers_bf16(hidden_size) else "fp32"
        else:  # fp32 until worker/train/calibrate.py has measured
            choice = "fp32"
    if choice == "fp16" and not cuda:
        raise UserError("precision: fp16 needs a CUDA GPU; use fp32 or bf16 on a CPU")
    return precision_named(choice)


def precision_named(choice: str) -> Precision:
    if choice == "bf16":
        return Precision(True, False, torch.bfloat16, "bf16")
    if choice == "fp16":
        return Precision(False, True, torch.float16, "fp16")
    return Precision(False, False, torch.float32, "fp32")


def resolve_optimizer(cfg: JobConfig, channel: Channel) -> str:
    if cfg.optim in BNB_OPTIMIZERS and not torch.cuda.is_available():
        channel.warn(f"optim {cfg.optim!r} needs bitsandbytes GPU kernels; using torch's fused AdamW "
                     "('adamw_torch_fused') on CPU")
        return "adamw_torch_fused"
    return cfg.optim


def resolve_gradient_checkpointing(
    cfg: JobConfig, channel: Channel, model: torch.nn.Module, precision: Precision
) -> bool:
    """The job's activation checkpointing; `auto` decides from the estimated memory (worker/train/memory.py)."""
    if cfg.gradient_checkpointing == "unsloth":
        channel.warn(
            'gradient_checkpointing "unsloth" is Unsloth\'s own variant; using standard gradient checkpointing'
        )
        return True
    if cfg.gradient_checkpointing == "auto":
        shape = {**model.config.to_dict(), "_attn_implementation": model.config._attn_implementation}
        choice = memory.decide(cfg, shape, precision.name, memory.available_bytes())
        channel.log(choice.note)
        return choice.on
    return bool(cfg.gradient_checkpointing)


def resolve_checkpoint(cfg: JobConfig) -> str | None:
    """The checkpoint folder to resume from, or None; raises UserError if there is no complete one.

    "latest" is the newest *complete* checkpoint-N in output_dir (trainer state, weights and optimizer
    present and readable): a folder a killed worker left half-written is passed over.
    """
    wanted = cfg.resume_from_checkpoint
    if not wanted:
        return None
    if wanted == "latest":
        found = latest_checkpoint(cfg.output_dir)
        if found is None:
            raise UserError(f"resume_from_checkpoint: no complete checkpoint-* folder in {cfg.output_dir}")
        return found
    path = expand(wanted)
    if not is_complete(path):
        raise UserError(f"resume_from_checkpoint: {wanted} is not a complete checkpoint folder (it needs "
                        "trainer_state.json, the weights and optimizer.pt, all readable)")
    return str(path)


# Reads the records logged so far; a message to warn with once, or None (reward_signal.no_signal_warning).
Watch = Callable[[Sequence[dict[str, Any]]], str | None]


class ReportingCallback(TrainerCallback):
    """Turns the trainer's logs into Progress events, warns once when `watch` finds a fault in the records
    (GRPO without reward spread), and stops when the parent asks."""

    def __init__(self, channel: Channel, watch: Watch | None = None) -> None:
        self.channel = channel
        self.watch = watch
        self.records: list[dict[str, Any]] = []
        self.stop: Stop | None = None
        self._t0 = time.monotonic()
        self._step0 = 0

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any):
        self._t0 = time.monotonic()
        self._step0 = state.global_step  # non-zero on resume: rates count this process's steps only

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any):
        stop = self.channel.stop_request
        if stop is not None:
            self.stop = stop
            control.should_training_stop = True
            control.should_save = stop.save  # the trainer saves model, optimizer, scheduler, RNG, state
            control.should_evaluate = False

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, logs=None, **kw: Any):
        logs = logs or {}
        if "loss" not in logs and "eval_loss" not in logs:
            return  # the end-of-training summary; its figures go into Completed
        elapsed = time.monotonic() - self._t0
        tokens = logs.get("num_tokens")  # TRL counts the tokens this trainer has seen
        tps = tokens / elapsed if tokens is not None and elapsed > 0 else None
        done = state.global_step - self._step0
        eta = elapsed / done * (state.max_steps - state.global_step) if done > 0 else None
        event: Progress = self.channel.progress(
            step=state.global_step,
            total_steps=state.max_steps,
            epoch=state.epoch,
            loss=logs.get("loss"),
            learning_rate=logs.get("learning_rate"),
            grad_norm=logs.get("grad_norm"),
            eval_loss=logs.get("eval_loss"),
            num_tokens=int(tokens) if tokens is not None else None,
            tokens_per_second=tps,
            # per rank x accumulation x ranks: what one optimizer step sees over every rank
            global_batch_size=args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size,
            elapsed_seconds=elapsed,
            eta_seconds=eta,
            peak_memory_mb=performance.peak_memory_mb(),
            extra=methods.extra_metrics(logs),
        )
        self.records.append(event.record())
        if self.watch is not None and (message := self.watch(self.records)):
            self.watch = None  # once: the fault is said, not repeated at every later step
            self.channel.warn(message)


def build_trainer(
    cfg: JobConfig,
    model: torch.nn.Module,
    tokenizer: Any,
    data: PreparedData,
    precision: Precision,
    gradient_checkpointing: bool,
    channel: Channel,
    report_to: list[str] | None = None,
) -> tuple[Any, ReportingCallback]:
    """The trainer of the job's method (SFTTrainer for sft and pretrain) and its reporting callback."""
    has_eval = _check_data(cfg, data, channel)
    common = _common_args(cfg, precision, gradient_checkpointing, channel, has_eval, report_to)
    callback = ReportingCallback(channel, _watch(cfg))
    # The early stopper sees an evaluation's figures first: the generation metrics it adds reach the Progress event.
    held = data.eval_examples if data.eval_examples is not None else data.eval  # as conversations, not tokens
    callbacks = [callback] if cfg.early_stopping is None else [EarlyStopper(cfg, channel, tokenizer, held),
                                                                 callback]
    if not methods.uses_sft_trainer(cfg):
        return methods.build_trainer(cfg, model, tokenizer, data, common, callbacks, has_eval), callback
    return _sft_trainer(cfg, model, tokenizer, data, common, callbacks, has_eval), callback


def _check_data(cfg: JobConfig, data: PreparedData, channel: Channel) -> bool:
    """Whether the job evaluates; warns of train_on_completions on plain text, refuses early_stopping without eval."""
    if cfg.train_on_completions and "text" in data.train.column_names:
        channel.warn("train_on_completions has no effect on plain text data (it has no prompt and completion): "
                     "every token is trained on; use prompt/completion or a chat format to mask prompts")
    has_eval = data.eval is not None and cfg.eval_steps > 0
    if cfg.early_stopping is not None and not has_eval:
        raise UserError("early_stopping: the job has no eval split to watch (the dataset has too few rows to hold "
                        "some out); give an eval_split, or train without early_stopping")
    return has_eval


def _common_args(
    cfg: JobConfig,
    precision: Precision,
    gradient_checkpointing: bool,
    channel: Channel,
    has_eval: bool,
    report_to: list[str] | None,
) -> dict[str, Any]:
    """The TrainingArguments every method's config shares."""
    keeps_best = cfg.early_stopping is not None and cfg.keep_best
    # Below 1, eval_steps is a fraction of the total steps (TrainingArguments reads floats < 1 that way).
    eval_steps = (cfg.eval_steps if cfg.eval_steps < 1 else int(cfg.eval_steps)) if has_eval else None
    warmup = cfg.warmup_steps if cfg.warmup_steps is not None else (cfg.warmup_ratio or 0)
    return dict(
        output_dir=cfg.output_dir,
        seed=cfg.random_seed,
        data_seed=cfg.random_seed,
        num_train_epochs=cfg.num_epochs,
        max_steps=cfg.max_steps if cfg.max_steps > 0 else -1,
        per_device_train_batch_size=cfg.batch_size,
        per_device_eval_batch_size=cfg.batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        learning_rate=cfg.learning_rate,
        weight_decay=cfg.weight_decay,
        warmup_steps=warmup,
        lr_scheduler_type=cfg.lr_scheduler_type,
        optim=resolve_optimizer(cfg, channel),
        bf16=precision.bf16,
        fp16=precision.fp16,
        use_cpu=not torch.cuda.is_available(),
        activation_checkpointing=gradient_checkpointing,  # the new name of gradient_checkpointing
        logging_steps=cfg.logging_steps,
        logging_strategy="steps",
        eval_strategy="steps" if has_eval else "no",
        eval_steps=eval_steps,
        save_strategy="steps" if cfg.save_steps > 0 else "no",
        save_steps=cfg.save_steps if cfg.save_steps > 0 else 500,
        # keep_best saves at each new best (worker/train/best.py); with no periodic checkpoints only the best one and
        # the newest are kept (rotation never deletes the best)
        save_total_limit=1 if keeps_best and cfg.save_steps == 0 else None,
        report_to=report_to or [],
        disable_tqdm=True,
        dataloader_num_workers=0,
        # Under torchrun: every trainable parameter gets a gradient (LoRA and full alike), so DDP
        # need not search the graph for unused ones each step.
        ddp_find_unused_parameters=False,
    )


def _sft_trainer(
    cfg: JobConfig,
    model: torch.nn.Module,
    tokenizer: Any,
    data: PreparedData,
    common: dict[str, Any],
    callbacks: list[Any],
    has_eval: bool,
) -> SFTTrainer:
    """TRL's SFTTrainer (sft and pretrain), its batching installed and its checkpoints saved atomically."""
    # TRL's loss-mask flags differ by shape: completion_only_loss masks prompt/completion rows;
    # {"messages"} rows need assistant_only_loss (completion_only_loss silently does nothing there,
    # as it does on plain text).
    conversational_messages = "messages" in data.train.column_names
    if "images" in data.train.column_names:
        return _vision_trainer(cfg, model, tokenizer, data, common, callbacks, has_eval)
    args = SFTConfig(
        **common,
        max_length=cfg.max_seq_length,
        packing=cfg.packing,
        completion_only_loss=cfg.train_on_completions,
        assistant_only_loss=cfg.train_on_completions and conversational_messages,
    )
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=data.train,
        eval_dataset=data.eval if has_eval else None,
        processing_class=tokenizer,
        callbacks=callbacks,
    )
    try:
        batching.install(trainer, cfg.padding_free)  # after TRL has tokenised and cut the rows to max_length
    except ValueError as exc:
        raise UserError(str(exc)) from None
    save_checkpoints_atomically(trainer)  # a worker killed while saving leaves the previous checkpoint usable
    return trainer


def _vision_trainer(cfg: JobConfig, model: torch.nn.Module, processor: Any, data: PreparedData,
                    common: dict[str, Any], callbacks: list[Any], has_eval: bool) -> SFTTrainer:
    """SFTTrainer on rows with images: TRL's vision collator renders and tokenises each batch with the processor
    (worker/data/image_data.py has measured every row: none is cut); train_on_completions trains the assistant's
    turns only (the template's generation markers)."""
    args = SFTConfig(
        **common,
        max_length=cfg.max_seq_length,
        packing=False,
        assistant_only_loss=cfg.train_on_completions,
        remove_unused_columns=False,  # the collator reads the images column
        dataset_kwargs={"skip_prepare_dataset": True},
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=data.train,
                         eval_dataset=data.eval if has_eval else None, processing_class=processor,
                         callbacks=callbacks)
    save_checkpoints_atomically(trainer)
    return trainer


def _watch(cfg: JobConfig) -> Watch | None:
    """What the job's records are watched for while it trains: a GRPO job that gets no reward spread."""
    if cfg.method != "grpo":
        return None
    return partial(reward_signal.no_signal_warning, num_generations=cfg.num_generations,
                   temperature=cfg.generation_temperature, rewards=[reward_name(e) for e in cfg.reward_functions])


@torch.no_grad()
def generate(model: torch.nn.Module, tokenizer: Any, prompt: str, max_new_tokens: int = 40) -> str:
    """Greedy generation of one reply, for before/after samples."""
    was_training = model.training
    model.eval()
    if tokenizer.chat_template:
        inputs = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
    else:
        inputs = tokenizer(prompt, return_tensors="pt")
    device = next(model.parameters()).device
    inputs = {k: v.to(device) for k, v in inputs.items()}
    output = model.generate(
        **inputs,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        use_cache=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    if was_training:
        model.train()
    return tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True).strip()

