"""The words a job config is written in: literals, enums, bounds, and the spellings each word also takes."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AfterValidator

__all__ = [
    "FIELD_GROUPS", "FORMAT_ALIASES", "GENERATION_METRICS", "MAX_ROWS", "MAX_STEPS", "ROLE_ALIASES", "SECRET_FIELDS",
    "SPEECH_METRICS", "TOOL_METRICS",
    "DpoLoss", "FormatType", "LrScheduler", "MappingTarget", "Method", "MethodField", "Optimizer", "PathText",
    "ReportTarget", "Role", "TrainingType",
]

SECRET_FIELDS = ("hf_token", "wandb_token")

# Upper bounds for counts: far beyond any real job, small enough for every integer column and loop.
MAX_STEPS = 100_000_000
MAX_ROWS = 10_000_000_000


def _nameable(value: str) -> str:
    # No file name holds a NUL byte: every os call refuses it with a ValueError, which reached the API's clients
    # as a 500 from the path checks (schemathesis found it on an export's output_dir). Refused here, by field.
    if "\x00" in value:
        raise ValueError("a path (or hub id) cannot hold a NUL byte (\\x00)")
    return value


# The text of a field that names a file or folder (or a hub id in its place): any text a path can be.
PathText = Annotated[str, AfterValidator(_nameable)]


class TrainingType(StrEnum):
    lora = "lora"
    qlora = "qlora"
    full = "full"


Method = Literal["sft", "dpo", "orpo", "kto", "grpo", "pretrain", "reward"]

# Kinds of data (worker/modalities/, one module each): what a job's rows hold, and those the worker can train
# (worker/modalities.MODALITIES has exactly these; tests/worker/test_modalities.py holds them together).
Modality = Literal["text", "image", "audio"]
TRAINED_MODALITIES: tuple[Modality, ...] = ("text", "image", "audio")

FormatType = Literal[
    "auto", "alpaca", "sharegpt", "messages", "prompt_completion", "text",
    # the formats of the other training methods (see methods.METHOD_SPECS)
    "preference", "unpaired", "prompt_only",
]
FORMAT_ALIASES = {
    "": "auto",
    "openai": "messages",
    "chatml": "messages",
    "conversation": "messages",
    "prompt-completion": "prompt_completion",
    "completion": "prompt_completion",
    "plain": "text",
    "preferences": "preference",
    "pairs": "preference",
    "prompts": "prompt_only",
}

# Optimizer names this project passes to `TrainingArguments.optim`. The 8-bit
# and paged ones need bitsandbytes kernels; the worker falls back to torch AdamW
# (with a warning) where those cannot run.
Optimizer = Literal[
    "adamw_torch",
    "adamw_torch_fused",
    "adamw_8bit",
    "adamw_bnb_8bit",
    "paged_adamw_8bit",
    "paged_adamw_32bit",
    "adafactor",
    "sgd",
    "adagrad",
    "rmsprop",
    "lion_8bit",
    "lion_32bit",
]

LrScheduler = Literal[
    "linear",
    "cosine",
    "cosine_with_restarts",
    "cosine_with_min_lr",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
    "reduce_lr_on_plateau",
    "warmup_stable_decay",
]

Role = Literal["system", "user", "assistant"]
# custom_format_mapping maps a column to a chat role (sft) or to a field of the method's format (the others).
MethodField = Literal["prompt", "chosen", "rejected", "completion", "label", "answer", "text"]
MappingTarget = Role | MethodField
ROLE_ALIASES = {"human": "user", "gpt": "assistant", "instruction": "user", "input": "user",
                "output": "assistant", "response": "assistant", "bot": "assistant"}

# What the held-out evaluation measures on generated answers (worker/train/evaluation.py's METRICS, by these names).
GENERATION_METRICS: tuple[str, ...] = ("exact_match", "token_f1", "rouge_l")
# What it measures on the calls of held-out rows that come with tools (worker/train/tool_scores.py), 0..1 each.
TOOL_METRICS: tuple[str, ...] = ("tool_choice", "tool_name", "tool_args", "tool_arg_match")
# An audio job's held-out figures (worker/train/speech_eval.py): word and character error rates, lower is better.
SPEECH_METRICS: tuple[str, ...] = ("wer", "cer")

# Where a job's figures go beside the studio's own store: an MLflow tracking store, W&B, TensorBoard.
ReportTarget = Literal["mlflow", "wandb", "tensorboard"]

# The groups a JobConfig field names in its json_schema_extra (config/parts.py), in the order the page's Advanced
# section shows them, with their titles; tests/api/test_form_fields.py holds every field to one of them.
FIELD_GROUPS: dict[str, str] = {
    "data": "Data", "media": "Images and audio", "lora": "LoRA", "optimisation": "Optimisation",
    "evaluation": "Evaluation", "logging": "Logging and outputs", "other": "Other",
    # today's fields of these have controls of their own
    "model": "Model", "method": "Training method",
}

DpoLoss = Literal["sigmoid", "hinge", "ipo", "robust", "bco_pair", "sppo_hard", "nca_pair", "apo_zero", "apo_down",
                  "sigmoid_norm"]
