"""`JobConfig`: every training parameter of a job, its default and its validation.

This is the one place defaults live. The parent validates a config before any
process starts; the worker receives `model_dump(mode="json")` (secrets removed)
plus the secrets through a separate channel, and validates it again.

The model is pure: validators never touch the filesystem and never derive one
field from another, so `JobConfig.model_validate(c.public_dict() | c.secrets())
== c` (tests/test_config.py checks it on generated configs). Paths are made
absolute and checked in an explicit step, `tunestudio.paths`. Every number has
bounds, and NaN or infinity is refused.

The seed's request fields are accepted under their seed names and spellings
("LoRA/QLoRA", "Full Finetuning", learning_rate as a string, "" for unset).
Values that only meant something to the seed's own engine ("unsloth" gradient
checkpointing, the 8-bit optimizers) are kept as given; the worker maps them to
their nearest equivalent and says so in a warning event.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from enum import StrEnum
from pathlib import Path, PurePath
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

__all__ = [
    "BUILTIN_REWARDS", "METHODS", "METHOD_FORMATS", "METHOD_MAIN_METRIC", "METHOD_OPTIONS", "SECRET_FIELDS",
    "ConfigError", "JobConfig", "TrainingType", "load_config", "reward_name", "reward_source",
]

SECRET_FIELDS = ("hf_token", "wandb_token")


class TrainingType(StrEnum):
    lora = "lora"
    qlora = "qlora"
    full = "full"


FormatType = Literal[
    "auto", "alpaca", "sharegpt", "messages", "prompt_completion", "text",
    # the formats of the other training methods (see METHOD_FORMATS)
    "preference", "unpaired", "prompt_only",
]
_FORMAT_ALIASES = {
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
_ROLE_ALIASES = {"human": "user", "gpt": "assistant", "instruction": "user", "input": "user",
                 "output": "assistant", "response": "assistant", "bot": "assistant"}

# --- training methods (issue 15): what each method reads and which options apply to it ----
# Pure data, shared by the validator below, the worker (tunestudio/worker/methods.py,
# worker/data/method_formats.py, worker/rewards.py), the CLI and the page.
Method = Literal["sft", "dpo", "orpo", "kto", "grpo", "pretrain"]
_METHOD_ALIASES = {"continued_pretraining": "pretrain", "pretraining": "pretrain", "cpt": "pretrain",
                   "supervised": "sft"}
METHODS: tuple[str, ...] = ("sft", "dpo", "orpo", "kto", "grpo", "pretrain")
# The dataset formats each method trains on ("auto" picks one from the columns).
METHOD_FORMATS: dict[str, tuple[str, ...]] = {
    "sft": ("alpaca", "sharegpt", "messages", "prompt_completion", "text"),
    "pretrain": ("text",),
    "dpo": ("preference",),
    "orpo": ("preference",),
    "kto": ("unpaired", "preference"),  # TRL's KTOTrainer splits each pair into a desirable and an undesirable row
    "grpo": ("prompt_only",),
}
# JobConfig options that mean something for some methods only. Setting one (to other than its default)
# for another method is a validation error naming both.
METHOD_OPTIONS: dict[str, tuple[str, ...]] = {
    "beta": ("dpo", "orpo", "kto"),
    "dpo_loss_type": ("dpo",),
    "desirable_weight": ("kto",),
    "undesirable_weight": ("kto",),
    "num_generations": ("grpo",),
    "max_completion_length": ("grpo",),
    "generation_temperature": ("grpo",),
    "kl_beta": ("grpo",),
    "reward_functions": ("grpo",),
    "reward_weights": ("grpo",),
    "reward_format_pattern": ("grpo",),
    "packing": ("sft", "pretrain"),
    "padding_free": ("sft", "pretrain"),
    "train_on_completions": ("sft",),
}
# Built-in GRPO reward functions (tunestudio/worker/rewards.py); the first three compare with a row's `answer`.
BUILTIN_REWARDS: tuple[str, ...] = ("exact_match", "contains_answer", "numeric_match", "format_regex", "length_penalty")
ANSWER_REWARDS: tuple[str, ...] = ("exact_match", "contains_answer", "numeric_match")
_USER_REWARD = re.compile(r"^(?P<path>.+\.py):(?P<name>[A-Za-z_][A-Za-z0-9_]*)$")
# The metric each method is watched by (CLI progress bar, the page's method chart); sft/pretrain: the loss.
METHOD_MAIN_METRIC: dict[str, str] = {"dpo": "rewards/margins", "orpo": "rewards/margins",
                                      "kto": "rewards/margins", "grpo": "reward"}
DpoLoss = Literal["sigmoid", "hinge", "ipo", "robust", "bco_pair", "sppo_hard", "nca_pair", "apo_zero", "apo_down",
                  "sigmoid_norm"]


def reward_name(entry: str) -> str:
    """The name a reward function's metrics are logged under: a built-in's name, or the user function's."""
    match = _USER_REWARD.match(entry)
    return match.group("name") if match else entry


def reward_source(entry: str) -> str | None:
    """The file of a user reward function ("path/to/file.py:function"); None for a built-in."""
    match = _USER_REWARD.match(entry)
    return match.group("path") if match else None


# Upper bounds for counts: far beyond any real job, small enough for every integer column and loop.
MAX_STEPS = 100_000_000
MAX_ROWS = 10_000_000_000


class ConfigError(ValueError):
    """A config file could not be read or did not validate; the message is for the user."""


def _blank_to_none(value: Any) -> Any:
    if isinstance(value, str) and value.strip() == "":
        return None
    return value


class JobConfig(BaseModel):
    """One fine-tuning job. Unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", validate_default=True, use_enum_values=False, allow_inf_nan=False)

    # --- model -----------------------------------------------------------------
    model_name: str = Field(min_length=1, description="Local model folder or a hub model id.")
    training_type: TrainingType = TrainingType.lora
    load_in_4bit: bool = Field(
        default=False, description="4-bit weights; true exactly when training_type is qlora."
    )
    max_seq_length: int = Field(default=2048, ge=8, le=1_048_576)
    hf_token: SecretStr | None = None
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"

    # --- data ------------------------------------------------------------------
    hf_dataset: str | None = None
    local_datasets: list[str] = Field(default_factory=list, max_length=256)
    format_type: FormatType = "auto"
    subset: str | None = None
    train_split: str = "train"
    eval_split: str | None = None
    eval_steps: float = Field(
        default=0.0, ge=0, le=MAX_STEPS, description="0: no eval; below 1: a fraction of the total steps; else steps."
    )
    dataset_slice_start: int | None = Field(default=None, ge=0, le=MAX_ROWS, description="First row kept (inclusive).")
    dataset_slice_end: int | None = Field(default=None, ge=0, le=MAX_ROWS, description="Last row kept (inclusive).")
    custom_format_mapping: dict[str, MappingTarget] | None = Field(
        default=None, description="Column → chat role (sft), or column → field of the method's format (others)."
    )

    # --- optimisation ----------------------------------------------------------
    num_epochs: float = Field(default=3.0, gt=0, le=10_000)
    learning_rate: float = Field(default=2e-4, gt=0, le=1.0)
    batch_size: int = Field(default=2, ge=1, le=65_536)
    gradient_accumulation_steps: int = Field(default=4, ge=1, le=65_536)
    warmup_steps: int | None = Field(default=None, ge=0, le=MAX_STEPS)
    warmup_ratio: float | None = Field(default=None, ge=0, lt=1)
    max_steps: int = Field(default=0, ge=0, le=MAX_STEPS, description="0: train for num_epochs.")
    save_steps: int = Field(default=0, ge=0, le=MAX_STEPS, description="0: no periodic checkpoints.")
    logging_steps: int = Field(default=1, ge=1, le=MAX_STEPS)
    weight_decay: float = Field(default=0.01, ge=0, le=10)
    random_seed: int = Field(default=3407, ge=0, le=2**32 - 1)
    packing: bool = False
    padding_free: bool | Literal["auto"] = Field(
        default="auto",
        description="Batches as one flattened row with position ids instead of padded rows (the loss is the same). "
        "auto: per batch, whichever costs less for this model (always with flash attention).",
    )
    optim: Optimizer = "adamw_torch_fused"  # TrainingArguments' default; on full fine-tunes its step is faster
    lr_scheduler_type: LrScheduler = "linear"

    # --- scale out (issue 14) ---------------------------------------------------
    num_processes: int = Field(
        default=1,
        ge=1,
        le=256,
        description="Data-parallel ranks; above 1 the job runs under torchrun (gloo on a CPU, nccl on GPUs). "
        "batch_size is per rank: the global batch is batch_size x gradient_accumulation_steps x num_processes.",
    )

    # --- adapters --------------------------------------------------------------
    lora_r: int = Field(default=16, ge=1, le=4096)
    lora_alpha: int = Field(default=16, ge=1, le=65_536)
    lora_dropout: float = Field(default=0.0, ge=0, lt=1)
    target_modules: list[str] | None = Field(
        default=None, max_length=1024, description="Module names to adapt; unset means every linear layer."
    )
    gradient_checkpointing: bool | Literal["auto", "unsloth"] = Field(
        default="auto",
        description="Recompute activations in backward to save memory (slower). auto: on only when the job's "
        "estimated memory would not fit in what the machine has free.",
    )
    use_rslora: bool = False
    use_loftq: bool = False
    train_on_completions: bool = False

    # --- the seed's vision and audio fields (text models only for now) ---------
    is_dataset_image: bool = False
    is_dataset_audio: bool = False
    finetune_vision_layers: bool = True
    finetune_language_layers: bool = True
    finetune_attention_modules: bool = True
    finetune_mlp_modules: bool = True

    # --- logging integrations --------------------------------------------------
    enable_wandb: bool = False
    wandb_token: SecretStr | None = None
    wandb_project: str = "tunestudio"
    enable_tensorboard: bool = False
    tensorboard_dir: str = Field(
        default="runs", min_length=1, description="TensorBoard event files; relative: inside output_dir."
    )

    # --- outputs ---------------------------------------------------------------
    output_dir: str | None = Field(default=None, description="Where artefacts go; set by the launcher if unset.")
    resume_from_checkpoint: str | None = Field(
        default=None, description='A checkpoint folder, or "latest" in output_dir.'
    )
    sample_prompts: list[str] = Field(
        default_factory=list,
        description="Prompts generated from before and after training, to compare base and result.",
        max_length=16,
    )
    eval_generate_rows: int = Field(
        default=32, ge=0, le=1000,
        description="Held-out rows the base and the trained model answer, for exact match, token F1 and ROUGE-L "
                    "(needs an eval split: eval_steps > 0); 0: loss only.",
    )

    # --- training method (issue 15): see METHODS, METHOD_OPTIONS, METHOD_FORMATS above -------------
    method: Method = Field(
        default="sft",
        description="sft: supervised fine-tuning; dpo / orpo / kto: preference tuning; grpo: reinforcement "
                    "learning with reward functions; pretrain: continued pretraining on plain text.",
    )
    beta: float = Field(
        default=0.1, gt=0, le=100,
        description="DPO, KTO: how far the model may move from where it started (higher: less); "
                    "ORPO: the weight of the odds-ratio term (λ).",
    )
    dpo_loss_type: DpoLoss = Field(default="sigmoid", description="DPO: the loss (sigmoid is the paper's).")
    desirable_weight: float = Field(default=1.0, gt=0, le=100, description="KTO: weight of desirable rows' loss.")
    undesirable_weight: float = Field(default=1.0, gt=0, le=100,
                                      description="KTO: weight of undesirable rows' loss.")
    num_generations: int = Field(
        default=4, ge=2, le=256,
        description="GRPO: completions per prompt; batch_size × gradient_accumulation_steps must be a multiple.",
    )
    max_completion_length: int = Field(default=128, ge=1, le=131_072,
                                       description="GRPO: most tokens generated per completion.")
    generation_temperature: float = Field(default=1.0, gt=0, le=10, description="GRPO: sampling temperature.")
    kl_beta: float = Field(default=0.0, ge=0, le=100,
                           description="GRPO: KL penalty against the starting model; 0 loads no reference.")
    reward_functions: list[str] = Field(
        default_factory=list, max_length=16,
        description="GRPO: built-in names (exact_match, contains_answer, numeric_match, format_regex, "
                    "length_penalty) or path/to/file.py:function (your code, run inside the worker).",
    )
    reward_weights: list[Annotated[float, Field(ge=-1000, le=1000)]] | None = Field(
        default=None, max_length=16, description="GRPO: one weight per reward function; unset: 1 each."
    )
    reward_format_pattern: str | None = Field(
        default=None, max_length=2000,
        description="GRPO: the regular expression format_regex rewards (re.search; anchor with ^...$).",
    )

    @model_validator(mode="before")
    @classmethod
    def _method_defaults(cls, data: Any) -> Any:
        """Method spellings, and the defaults that depend on the method: pretrain packs unless told not to."""
        if not isinstance(data, dict) or not isinstance(data.get("method"), str):
            return data
        data = dict(data)
        word = data["method"].strip().lower().replace("-", "_").replace(" ", "_")
        data["method"] = _METHOD_ALIASES.get(word, word)
        if data["method"] == "pretrain" and data.get("packing") is None:
            data["packing"] = True
        return data

    @field_validator("reward_weights", "reward_format_pattern", mode="before")
    @classmethod
    def _method_blank_is_unset(cls, value: Any) -> Any:
        return None if value == [] else _blank_to_none(value)

    @model_validator(mode="after")
    def _method_options(self) -> JobConfig:
        """Options for other methods, formats, mappings and reward functions; no I/O (files load in the worker)."""
        method = self.method
        for name, methods in METHOD_OPTIONS.items():
            default = type(self).model_fields[name].get_default(call_default_factory=True)
            if method not in methods and getattr(self, name) != default:
                raise ValueError(f"{name}: applies to method{'s' if len(methods) > 1 else ''} {', '.join(methods)}, "
                                 f"not to method {method!r}")
        if self.format_type != "auto" and self.format_type not in METHOD_FORMATS[method]:
            raise ValueError(f"format_type: {self.format_type!r} is not a format of method {method!r}; use auto or "
                             f"{' or '.join(METHOD_FORMATS[method])}")
        self._check_mapping()
        if method == "kto" and self.batch_size < 2:
            raise ValueError("batch_size: method 'kto' needs a batch_size of at least 2 (its KL estimate pairs each "
                             "row with another row of the same batch)")
        if method == "grpo":
            self._check_rewards()
            if (self.batch_size * self.gradient_accumulation_steps) % self.num_generations:
                raise ValueError(
                    f"num_generations: batch_size × gradient_accumulation_steps "
                    f"({self.batch_size * self.gradient_accumulation_steps}) must be a multiple of num_generations "
                    f"({self.num_generations}) for method 'grpo' (each prompt's completions share one batch)")
        return self

    def _check_mapping(self) -> None:
        mapping = self.custom_format_mapping
        if mapping is None:
            return
        roles = {"system", "user", "assistant"}
        targets = list(mapping.values())
        if self.method == "sft":
            wrong = sorted(set(targets) - roles)
            if wrong:
                raise ValueError(f"custom_format_mapping: method 'sft' maps columns to roles (system, user, "
                                 f"assistant), not to {', '.join(wrong)}")
            return
        needed = {"dpo": ("prompt", "chosen", "rejected"), "orpo": ("prompt", "chosen", "rejected"),
                  "kto": ("prompt", "completion", "label"), "grpo": ("prompt",), "pretrain": ("text",)}[self.method]
        allowed = set(needed) | ({"answer"} if self.method == "grpo" else set())
        if self.method == "kto":
            allowed |= {"chosen", "rejected"}  # preference pairs also train KTO
            if {"chosen", "rejected"} <= set(targets):
                needed = ("prompt", "chosen", "rejected")
        wrong = sorted(set(targets) - allowed)
        missing = [f for f in needed if f not in targets]
        if wrong or missing or len(set(targets)) != len(targets):
            raise ValueError(
                f"custom_format_mapping: method {self.method!r} maps columns to {', '.join(needed)}"
                + (" (and optionally answer)" if self.method == "grpo" else "")
                + (f"; {', '.join(wrong)} is not one of them" if wrong else "")
                + (f"; nothing maps to {', '.join(missing)}" if missing else "")
                + ("; two columns map to one field" if len(set(targets)) != len(targets) else ""))

    def _check_rewards(self) -> None:
        entries = self.reward_functions
        if not entries:
            raise ValueError("reward_functions: method 'grpo' needs at least one reward function: a built-in ("
                             f"{', '.join(BUILTIN_REWARDS)}) or path/to/file.py:function")
        for entry in entries:
            if entry not in BUILTIN_REWARDS and not _USER_REWARD.match(entry):
                raise ValueError(f"reward_functions: {entry!r} is neither a built-in ({', '.join(BUILTIN_REWARDS)}) "
                                 "nor path/to/file.py:function")
        names = [reward_name(e) for e in entries]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"reward_functions: {', '.join(twice)} named twice (each reward is logged by its name)")
        if self.reward_weights is not None and len(self.reward_weights) != len(entries):
            raise ValueError(f"reward_weights: {len(self.reward_weights)} weights for {len(entries)} reward functions")
        if "format_regex" in entries:
            if not self.reward_format_pattern:
                raise ValueError("reward_format_pattern: reward function format_regex needs a pattern")
            try:
                re.compile(self.reward_format_pattern)
            except re.error as exc:
                raise ValueError(f"reward_format_pattern: not a regular expression: {exc}") from None
        elif self.reward_format_pattern:
            raise ValueError("reward_format_pattern: applies to reward function format_regex, which is not in "
                             "reward_functions")

    # --- field normalisation ---------------------------------------------------
    @model_validator(mode="before")
    @classmethod
    def _seed_spellings(cls, data: Any) -> Any:
        """Map the seed's training_type spellings; they depend on load_in_4bit."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        raw = data.get("training_type")
        if isinstance(raw, str):
            key = raw.strip().lower().replace("-", "").replace("_", "").replace(" ", "")
            if key == "lora/qlora":
                data["training_type"] = "qlora" if data.get("load_in_4bit", False) else "lora"
            elif key in ("fullfinetuning", "fullfinetune", "full"):
                data["training_type"] = "full"
            elif key in ("lora", "qlora"):
                data["training_type"] = key
        return data

    @field_validator(
        "hf_dataset", "subset", "eval_split", "output_dir", "resume_from_checkpoint",
        "hf_token", "wandb_token", "warmup_steps", "warmup_ratio",
        "dataset_slice_start", "dataset_slice_end", mode="before",
    )
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        return _blank_to_none(value)

    @field_validator("format_type", mode="before")
    @classmethod
    def _format_alias(cls, value: Any) -> Any:
        if value is None:
            return "auto"
        if isinstance(value, str):
            key = value.strip().lower()
            return _FORMAT_ALIASES.get(key, key)
        return value

    @field_validator("optim", "lr_scheduler_type", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("gradient_checkpointing", "padding_free", mode="before")
    @classmethod
    def _checkpointing_words(cls, value: Any) -> Any:
        if isinstance(value, str):
            word = value.strip().lower()
            if word in ("true", "on", "yes"):
                return True
            if word in ("false", "off", "no", "none", ""):
                return False
            return word
        return value

    @field_validator("local_datasets", mode="before")
    @classmethod
    def _one_path_is_a_list(cls, value: Any) -> Any:
        if value is None:
            return []
        if isinstance(value, str):
            return [value] if value.strip() else []
        return value

    @field_validator("local_datasets")
    @classmethod
    def _each_dataset_once(cls, value: list[str]) -> list[str]:
        # Each entry's rows are read, so a path listed twice trains on its rows twice (256 copies of a 400-row
        # file made 102,400 rows). Compared as written, normalised ("./a.jsonl" is "a.jsonl"); no filesystem.
        seen: dict[str, str] = {}
        for raw in value:
            key = str(PurePath(raw)) if raw else raw
            if key in seen:
                first = f" (first as {seen[key]!r})" if seen[key] != raw else ""
                raise ValueError(f"{raw!r} is listed twice{first}; list each dataset once (each entry's rows are "
                                 "read, so a second entry would train on them twice)")
            seen[key] = raw
        return value

    @field_validator("custom_format_mapping", mode="before")
    @classmethod
    def _role_aliases(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: _ROLE_ALIASES.get(str(v).strip().lower(), str(v).strip().lower()) for k, v in value.items()}
        return value

    @field_validator("target_modules", mode="before")
    @classmethod
    def _modules_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            if value.strip() in ("", "all-linear", "all_linear"):
                return None
            return [m.strip() for m in value.split(",") if m.strip()]
        if isinstance(value, list) and not value:
            return None
        return value

    @field_validator("model_name")
    @classmethod
    def _model_name_stripped(cls, value: str) -> str:
        value = value.strip()
        if not value:
            raise ValueError("model_name is empty")
        return value

    @field_validator("eval_steps")
    @classmethod
    def _whole_steps(cls, value: float) -> float:
        if value >= 1 and value != int(value):
            raise ValueError("eval_steps of 1 or more is a number of steps and must be whole")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> JobConfig:
        if self.training_type is TrainingType.full:
            # The seed does the same: full fine-tuning never loads 4-bit weights.
            self.load_in_4bit = False
        elif self.training_type is TrainingType.qlora:
            self.load_in_4bit = True
        elif self.load_in_4bit:
            raise ValueError("load_in_4bit: 4-bit weights need training_type 'qlora' (got 'lora')")

        if not self.local_datasets and not self.hf_dataset:
            raise ValueError("local_datasets: give local_datasets or hf_dataset; neither is set")
        if self.local_datasets and self.hf_dataset:
            raise ValueError("hf_dataset: give local_datasets or hf_dataset, not both")
        if (
            self.dataset_slice_start is not None
            and self.dataset_slice_end is not None
            and self.dataset_slice_end < self.dataset_slice_start
        ):
            raise ValueError(
                f"dataset_slice_end: {self.dataset_slice_end} is before dataset_slice_start "
                f"{self.dataset_slice_start} (both are inclusive)"
            )
        if self.warmup_steps is not None and self.warmup_ratio is not None:
            raise ValueError("warmup_ratio: set warmup_steps or warmup_ratio, not both")
        if self.use_loftq and self.training_type is not TrainingType.lora:
            raise ValueError(
                "use_loftq: LoftQ initialises LoRA weights from full-precision layers; use training_type 'lora'"
            )
        if self.is_dataset_image:
            raise ValueError("is_dataset_image: image datasets are not supported yet (text models only)")
        if self.is_dataset_audio:
            raise ValueError("is_dataset_audio: audio datasets are not supported yet (text models only)")
        if not self.finetune_language_layers:
            raise ValueError(
                "finetune_language_layers: training only vision layers is not supported yet (text models only)"
            )
        if not (self.finetune_attention_modules or self.finetune_mlp_modules):
            raise ValueError(
                "finetune_attention_modules: at least one of finetune_attention_modules and "
                "finetune_mlp_modules must be true"
            )
        if self.custom_format_mapping is not None and self.method == "sft":  # other methods: _method_options
            roles = set(self.custom_format_mapping.values())
            if "assistant" not in roles or "user" not in roles:
                raise ValueError(
                    "custom_format_mapping: map at least one column to 'user' and one to 'assistant'"
                )
        if self.resume_from_checkpoint == "latest" and not self.output_dir:
            raise ValueError('resume_from_checkpoint: "latest" needs output_dir')
        return self

    # --- views -----------------------------------------------------------------
    def public_dict(self) -> dict[str, Any]:
        """The config as JSON-ready data, with every secret removed (safe to store or show)."""
        return self.model_dump(mode="json", exclude=set(SECRET_FIELDS))

    def secrets(self) -> dict[str, str]:
        """The secrets that are set, for the worker's separate channel."""
        out = {}
        for name in SECRET_FIELDS:
            value = getattr(self, name)
            if value is not None:
                out[name] = value.get_secret_value()
        return out

    @classmethod
    def from_parts(cls, public: dict[str, Any], secrets: dict[str, str] | None = None) -> JobConfig:
        """Rebuild a config from `public_dict()` and `secrets()` (the worker's side)."""
        return cls.model_validate({**public, **(secrets or {})})


def format_validation_error(error: ValidationError) -> list[dict[str, str]]:
    """Field errors as [{field, message}], the shape every front end shows."""
    return field_errors(error.errors(include_url=False))


def field_errors(items: Iterable[Any]) -> list[dict[str, str]]:
    """[{field, message}] from pydantic's error items (a dict each, with "loc" and "msg")."""
    out = []
    for item in items:
        field = ".".join(str(p) for p in item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        if not field:  # whole-model checks name their field first: "field: reason"
            head, _, rest = message.partition(":")
            if head.isidentifier() and rest:
                field, message = head, rest.strip()
        out.append({"field": field, "message": message})
    return out


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> JobConfig:
    """Read a YAML or JSON job file and validate it.

    Raises ConfigError with one line per bad field.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"config {path} is not valid {path.suffix.lstrip('.').upper() or 'YAML'}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config {path} must hold a mapping of field: value")
    data.update(overrides or {})
    try:
        return JobConfig.model_validate(data)
    except ValidationError as exc:
        lines = [f"{e['field'] or '(config)'}: {e['message']}" for e in format_validation_error(exc)]
        raise ConfigError(f"invalid config {path}:\n  " + "\n  ".join(lines)) from None
