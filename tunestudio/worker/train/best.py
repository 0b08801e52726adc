"""Early stopping and keep-best: one eval metric watched at each evaluation during training.

At each evaluation (the trainer's own, every eval_steps) the watched metric is read from the evaluation's
figures: eval_loss, or the method's metric (eval_rewards/margins, eval_reward). A generation metric is measured
here: the model answers up to `early_stopping_rows` held-out rows greedily and the answers are scored
(worker/train/evaluation.py); the three scores join the evaluation's figures as eval_exact_match, eval_token_f1 and
eval_rouge_l, so the job's metric records (charts, metrics.jsonl) hold them.

A value better than the best so far by more than `min_delta` (lower for min, higher for max) is a new best. With
keep_best the trainer saves a checkpoint at that step (its own save, staged and renamed into place by
worker/train/checkpointing.py) and marks it as the trainer state's `best_model_checkpoint`, which checkpoint rotation
never deletes; with no periodic checkpoints (save_steps 0) rotation keeps only the best one and the newest.
`patience` evaluations in a row without a new best stop training. After training the best checkpoint's weights
are loaded back (`restore_best`), so the saved artefacts, the final evaluation, chat and export are the best
step's. The watch's state travels in the checkpoints (trainer_state.json), so a resumed job goes on counting.

Under torchrun every rank evaluates and decides alike: the losses are gathered by the trainer, and a generation
metric is measured by rank 0 and sent to the others.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from typing import Any, Literal

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from tunestudio.checkpoints import is_complete
from tunestudio.config import JobConfig
from tunestudio.events import Best
from tunestudio.worker.channel import Channel
from tunestudio.worker.errors import UserError
from tunestudio.worker.train import evaluation


@dataclass
class Watch:
    """The best value of one metric so far, and how many evaluations in a row have not improved on it.

    Any value better than the best is the new best (keep_best keeps the best seen); only one better by more than
    min_delta resets the count of evaluations without an improvement, which stops the job at `patience`.
    """

    metric: str
    direction: Literal["min", "max"]
    patience: int
    min_delta: float = 0.0
    best_step: int | None = None
    best_value: float | None = None
    stalls: int = 0

    def _beats(self, value: float, margin: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.best_value is None:
            return True
        if self.direction == "max":
            return value > self.best_value + margin
        return value < self.best_value - margin

    def observe(self, step: int, value: float) -> bool:
        """Record one evaluation; True when it is a new best."""
        improved = self._beats(value, self.min_delta)
        best = self._beats(value, 0.0)
        if best:
            self.best_step, self.best_value = step, value
        self.stalls = 0 if improved else self.stalls + 1
        return best

    @property
    def exhausted(self) -> bool:
        """Patience is spent: stop."""
        return self.stalls >= self.patience

    def describe(self) -> str:
        return f"best at step {self.best_step}: {self.metric} {self.best_value:.4f}"


class EarlyStopper(TrainerCallback, ExportableState):
    """Watches the job's early_stopping metric at each evaluation during training; saves and marks the best."""

    def __init__(self, cfg: JobConfig, channel: Channel, tokenizer: Any, eval_examples: Any) -> None:
        stopping = cfg.early_stopping
        assert stopping is not None
        self.channel = channel
        self.tokenizer = tokenizer
        self.keep_best = cfg.keep_best
        self.watch = Watch(stopping.metric, stopping.direction, stopping.patience, stopping.min_delta)
        self.key = stopping.metric if stopping.metric.startswith("eval_") else f"eval_{stopping.metric}"
        self.rows: list[evaluation.EvalRow] = []
        self.images: Any = None  # an image job's rows answer with their pictures (train/image_eval.py)
        if stopping.generates:
            limit = cfg.early_stopping_rows or cfg.eval_generate_rows
            if cfg.modality == "image":
                from tunestudio.worker.train.image_eval import ImageEvaluator

                self.images = ImageEvaluator.for_job(eval_examples or [], limit)
                self.rows = self.images.rows
            else:
                self.rows = evaluation.eval_rows(eval_examples, limit)
            if not self.rows:
                raise UserError(f"early_stopping.metric: {stopping.metric} compares generated answers with the "
                                "reference replies of held-out rows, and the eval split has no row with a prompt "
                                "and a reply; use eval_loss")
        self.checkpoint: str | None = None  # the best step's checkpoint (keep_best)
        self.stopped_at: int | None = None  # the step early stopping ended training at
        self._active = False

    # --- the trainer's events ---------------------------------------------------------
    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any):
        self._active = True  # evaluations before and after training (main.py's) are not watched
        saved = (state.stateful_callbacks or {}).get(type(self).__name__)
        if state.global_step > 0 and isinstance(saved, dict):  # resumed: go on from the checkpoint's count
            self._restore(saved.get("attributes") or {})

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any):
        self._active = False

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, logs=None,
               model: Any = None, **kw: Any):
        # An evaluation's figures pass here before the reporting callback turns them into a Progress event.
        if not self._active or not logs or "eval_loss" not in logs:
            return
        if self.rows:
            logs.update({f"eval_{name}": value for name, value in self._answer(model).items()})
        value = logs.get(self.key)
        if not isinstance(value, (int, float)):
            figures = ", ".join(sorted(k for k in logs if k.startswith("eval_")))
            raise UserError(f"early_stopping.metric: {self.key} is not among this evaluation's figures ({figures})")
        step, watch = state.global_step, self.watch
        previous = (watch.best_step, watch.best_value)
        note = f"step {step}: {watch.metric} {value:.4f}"
        best = watch.observe(step, float(value))
        if best:
            note += ", the best so far"
            if self.keep_best:
                control.should_save = True  # saved right after this evaluation, marked as the best
                self.checkpoint = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")
                state.best_model_checkpoint, state.best_metric = self.checkpoint, float(value)
                note += " (checkpoint kept)"
        if watch.stalls:
            if best and previous[1] is not None:  # better, by min_delta or less
                note += f", but by no more than {watch.min_delta:g} over {previous[1]:.4f} (step {previous[0]})"
            elif previous[1] is not None:
                note += (f", not better than {previous[1]:.4f} (step {previous[0]})"
                         + (f" by more than {watch.min_delta:g}" if watch.min_delta else ""))
            note += f": {watch.stalls} of {watch.patience} evaluations without an improvement"
        self.channel.log(note)
        if watch.exhausted:
            control.should_training_stop = True
            self.stopped_at = step
            self.channel.log(f"early stopping: {self.reason}")

    # --- after training ---------------------------------------------------------------------
    @property
    def reason(self) -> str:
        """Why training ended early ("" when it did not)."""
        if self.stopped_at is None:
            return ""
        watch = self.watch
        return (f"stopped early at step {self.stopped_at}: {watch.metric} did not improve"
                + (f" by more than {watch.min_delta:g}" if watch.min_delta else "")
                + f" for {watch.patience} evaluation{'s' if watch.patience > 1 else ''}"
                + (f"; {watch.describe()}" if watch.best_step is not None else ""))

    def best(self) -> Best | None:
        watch = self.watch
        if watch.best_step is None or watch.best_value is None:
            return None
        return Best(step=watch.best_step, metric=watch.metric, value=watch.best_value, checkpoint=self.checkpoint)

    def restore_best(self, trainer: Any) -> int:
        """With keep_best, load the best checkpoint's weights into the model; the step whose weights it has now."""
        step, watch = trainer.state.global_step, self.watch
        if not self.keep_best or watch.best_step is None or watch.best_step == step:
            return step
        if self.checkpoint is None or not is_complete(self.checkpoint):
            self.channel.warn(f"keep_best: the checkpoint of step {watch.best_step} is missing; the artefacts are "
                              f"the weights of the last step ({step})")
            self.checkpoint = None
            return step
        trainer.state.best_model_checkpoint = self.checkpoint
        with warnings.catch_warnings():  # peft's load_adapter asks for a renamed attribute of transformers 5
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            trainer._load_best_model()  # the Trainer's own loader: adapters (peft) or full weights
        self.channel.log(f"keep_best: the artefacts are the weights of step {watch.best_step}, not of the last "
                         f"step {step} ({watch.describe()})")
        return watch.best_step

    # --- the state a checkpoint carries (trainer_state.json) -------------------------------------
    def state(self) -> dict[str, Any]:
        watch = self.watch
        return {"args": {}, "attributes": {"metric": watch.metric, "best_step": watch.best_step,
                                           "best_value": watch.best_value, "stalls": watch.stalls,
                                           "checkpoint": self.checkpoint}}

    def _restore(self, saved: dict[str, Any]) -> None:
        if saved.get("metric") != self.watch.metric or saved.get("best_step") is None:
            return  # another metric (or none yet): start afresh
        self.watch.best_step, self.watch.best_value = int(saved["best_step"]), float(saved["best_value"])
        self.watch.stalls = int(saved.get("stalls") or 0)
        self.checkpoint = saved.get("checkpoint") if self.keep_best else None
        self.channel.log(f"early stopping goes on from the checkpoint: {self.watch.describe()}, "
                         f"{self.watch.stalls} of {self.watch.patience} evaluations without a better one")

    # --- generation ---------------------------------------------------------------------------
    def _answer(self, model: Any) -> dict[str, float]:
        """The generation metrics of the model's answers to the rows (rank 0 answers; every rank gets them)."""
        import torch.distributed as dist

        distributed = dist.is_available() and dist.is_initialized()
        scores: dict[str, float] = {}
        if not distributed or dist.get_rank() == 0:
            answers = (self.images.answers(model, self.tokenizer) if self.images is not None
                       else evaluation.generate_answers(model, self.tokenizer, self.rows))
            assert answers is not None
            scores = evaluation.score(answers, [r.reference for r in self.rows])
        if distributed:
            box = [scores]
            dist.broadcast_object_list(box, src=0)
            scores = box[0]
        return scores


def stopper_of(trainer: Any) -> EarlyStopper | None:
    """The trainer's early stopping callback, if the job has one."""
    return next((c for c in trainer.callback_handler.callbacks if isinstance(c, EarlyStopper)), None)
