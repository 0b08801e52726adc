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
from collections.abc import Iterable
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

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

__all__ = ["SECRET_FIELDS", "ConfigError", "JobConfig", "TrainingType", "load_config"]

SECRET_FIELDS = ("hf_token", "wandb_token")


class TrainingType(StrEnum):
    lora = "lora"
    qlora = "qlora"
    full = "full"


FormatType = Literal["auto", "alpaca", "sharegpt", "messages", "prompt_completion", "text"]
_FORMAT_ALIASES = {
    "": "auto",
    "openai": "messages",
    "chatml": "messages",
    "conversation": "messages",
    "prompt-completion": "prompt_completion",
    "completion": "prompt_completion",
    "plain": "text",
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
_ROLE_ALIASES = {"human": "user", "gpt": "assistant", "instruction": "user", "input": "user",
                 "output": "assistant", "response": "assistant", "bot": "assistant"}


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
    custom_format_mapping: dict[str, Role] | None = None

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
    optim: Optimizer = "adamw_torch"
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
    gradient_checkpointing: bool | Literal["unsloth"] = False
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

    @field_validator("gradient_checkpointing", mode="before")
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
        if self.custom_format_mapping is not None:
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
