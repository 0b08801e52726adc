"""The trainers of the methods beyond SFT: DPO, ORPO, KTO (preference tuning), GRPO and reward models; and SFT of a
speech encoder-decoder (an audio job: transformers' Seq2SeqTrainer, the trainer family `seq2seq`).

sft and pretrain both train with TRL's SFTTrainer (train.py); pretrain is SFT on
plain text, where every token is trained on and packing is on by default.

Each builder takes the arguments every method shares (train.py builds them from
the JobConfig: precision, schedule, logging, checkpoints) and adds its own. The
model arrives prepared (LoRA, QLoRA or full), the data in the method's format
(data/method_formats.py), and the callbacks (the one that turns logs into
Progress events and obeys stop commands; early stopping's, worker/train/best.py), so
stop/save, cancel, resume and early stopping work the same for every method.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from tunestudio.config import METHOD_SPECS, JobConfig
from tunestudio.worker.data import PreparedData

# Logged figures that are Progress fields already, or not metrics of the model's training.
_NOT_EXTRA = {
    "loss", "eval_loss", "learning_rate", "grad_norm", "epoch", "num_tokens", "step_time", "total_flos",
    "train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss", "eval_runtime",
    "eval_samples_per_second", "eval_steps_per_second", "eval_num_tokens",
}


def extra_metrics(logs: dict[str, Any]) -> dict[str, float] | None:
    """The method's own metrics of one log (e.g. rewards/margins, kl, reward), finite numbers only; None if none."""
    out = {
        key: float(value)
        for key, value in logs.items()
        if key not in _NOT_EXTRA and isinstance(value, (int, float)) and not isinstance(value, bool)
        and math.isfinite(value)
    }
    return out or None


def build_trainer(
    cfg: JobConfig,
    model: Any,
    tokenizer: Any,
    data: PreparedData,
    common: dict[str, Any],
    callbacks: list[Any],
    has_eval: bool,
) -> Any:
    """The trainer of `cfg.method`'s trainer family for the job's data (config.METHOD_SPECS: dpo, orpo, kto, grpo,
    reward; seq2seq for audio)."""
    shared = {
        "model": model,
        "train_dataset": data.train,
        "eval_dataset": data.eval if has_eval else None,
        "processing_class": tokenizer,
        "callbacks": callbacks,
    }
    return BUILDERS[METHOD_SPECS[cfg.method].trainer_for(cfg.modality)](cfg, common, shared)


def _dpo(cfg: JobConfig, common: dict[str, Any], shared: dict[str, Any]) -> Any:
    from trl import DPOConfig, DPOTrainer

    images = "images" in shared["train_dataset"].column_names  # TRL's vision collator reads the images column
    args = DPOConfig(**common, max_length=cfg.max_seq_length, beta=cfg.beta, loss_type=[cfg.dpo_loss_type],
                     **({"remove_unused_columns": False} if images else {}))
    return _without_reference_adapter(DPOTrainer(args=args, **shared), cfg)


def _kto(cfg: JobConfig, common: dict[str, Any], shared: dict[str, Any]) -> Any:
    from trl import KTOConfig, KTOTrainer

    args = KTOConfig(**common, max_length=cfg.max_seq_length, beta=cfg.beta,
                     desirable_weight=cfg.desirable_weight, undesirable_weight=cfg.undesirable_weight)
    return _without_reference_adapter(KTOTrainer(args=args, **shared), cfg)


def _orpo(cfg: JobConfig, common: dict[str, Any], shared: dict[str, Any]) -> Any:
    from trl.experimental.orpo import ORPOConfig, ORPOTrainer

    return ORPOTrainer(args=ORPOConfig(**common, max_length=cfg.max_seq_length, beta=cfg.beta), **shared)


def _grpo(cfg: JobConfig, common: dict[str, Any], shared: dict[str, Any]) -> Any:
    from trl import GRPOConfig, GRPOTrainer

    from tunestudio.worker import rewards
    from tunestudio.worker.train.reward_model import reward_function

    args = GRPOConfig(
        **{**common, "per_device_eval_batch_size": cfg.num_generations},  # an eval batch holds whole groups
        num_generations=cfg.num_generations,
        max_completion_length=cfg.max_completion_length,
        temperature=cfg.generation_temperature,
        beta=cfg.kl_beta,
        reward_weights=cfg.reward_weights,
    )
    return GRPOTrainer(reward_funcs=rewards.build(cfg, reward_function), args=args, **shared)


def _reward(cfg: JobConfig, common: dict[str, Any], shared: dict[str, Any]) -> Any:
    from trl import RewardConfig, RewardTrainer

    # the score is read at the last token that is not padding: the model must know the tokenizer's pad id
    shared["model"].config.pad_token_id = shared["processing_class"].pad_token_id
    return RewardTrainer(args=RewardConfig(**common, max_length=cfg.max_seq_length), **shared)


# One builder per trainer family of config.METHOD_SPECS but "sft" (SFTTrainer, built in train.py).
def _seq2seq(cfg: JobConfig, common: dict[str, Any], shared: dict[str, Any]) -> Any:
    """A speech encoder-decoder (Whisper's family) on clips and transcripts: transformers' Seq2SeqTrainer, each
    batch's clips made log-mel windows and its transcripts labels by the collator (data/audio_data.py); the loss is
    the decoder's on the transcript (its prefix of language and task tokens included, as Whisper's fine-tuning does)."""
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

    from tunestudio.worker.data import speech_collator
    from tunestudio.worker.train.checkpointing import save_checkpoints_atomically

    args = Seq2SeqTrainingArguments(**common, remove_unused_columns=False, label_names=["labels"])
    start = shared["model"].config.decoder_start_token_id
    trainer = Seq2SeqTrainer(args=args, data_collator=speech_collator(shared["processing_class"], start), **shared)
    save_checkpoints_atomically(trainer)
    return trainer


BUILDERS: dict[str, Callable[[JobConfig, dict[str, Any], dict[str, Any]], Any]] = {
    "dpo": _dpo, "kto": _kto, "orpo": _orpo, "grpo": _grpo, "reward": _reward, "seq2seq": _seq2seq,
}


def uses_sft_trainer(cfg: JobConfig) -> bool:
    """Whether the job trains with TRL's SFTTrainer (sft, pretrain) rather than a builder here."""
    return METHOD_SPECS[cfg.method].trainer_for(cfg.modality) == "sft"


def _without_reference_adapter(trainer: Any, cfg: JobConfig) -> Any:
    """Drop the frozen copy of the LoRA adapter that DPO and KTO add as their reference.

    TRL copies an adapter it finds on the model into a second one, "ref", since it
    cannot know that the adapter is new. Ours always is: its B matrices are zero, so
    the model with adapters disabled is exactly where training starts, and TRL uses
    that when there is no "ref". Without the copy, the saved artefacts hold one
    adapter (no "ref/" folder) and each step runs one adapter fewer. LoftQ is the
    exception: its adapter starts non-zero to correct the quantised weights.
    """
    model = trainer.model
    peft_config = getattr(model, "peft_config", None)
    if peft_config and "ref" in peft_config and not cfg.use_loftq:
        model.delete_adapter("ref")
    return trainer
