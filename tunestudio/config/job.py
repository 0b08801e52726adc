"""`JobConfig`: one fine-tuning job, composed of its parts (config/parts.py: model, data, optimisation,
adapters, media, method; config/reporting.py: logging, outputs, early stopping), each a pydantic model of its
fields; the whole is validated once.

The model is pure: validators never touch the filesystem, so `JobConfig.model_validate(c.public_dict() |
c.secrets()) == c` (tests/test_config.py checks it on generated configs). Derived fields: in `_consistent`,
`load_in_4bit` follows `training_type`; in `LoggingPart._trackers`, `report_to`'s wandb and tensorboard turn
`enable_wandb` and `enable_tensorboard` on. Paths are made absolute and checked in an explicit
step, `tunestudio.paths`. Every number has bounds, and NaN or infinity is refused.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tunestudio.config.methods import METHOD_OPTIONS, METHOD_SPECS
from tunestudio.config.parts import (
    AdapterPart,
    DataPart,
    MethodPart,
    ModelPart,
    OptimisationPart,
    SeedMediaPart,
    unique_datasets,
)
from tunestudio.config.reporting import (
    METHOD_METRICS,
    NO_REPLY_FORMATS,
    EarlyStopping,
    EarlyStoppingPart,
    LoggingPart,
    OutputPart,
)
from tunestudio.config.seed import normalise
from tunestudio.config.vocabulary import (
    GENERATION_METRICS,
    SECRET_FIELDS,
    TRAINED_MODALITIES,
    FormatType,
    MappingTarget,
    Method,
    PathText,
    TrainingType,
)

__all__ = ["DataSpec", "EarlyStopping", "JobConfig", "check_format", "check_mapping", "check_options", "check_rows",
           "unmeasured"]

ROLES = {"system", "user", "assistant"}


def check_format(method: str, format_type: str) -> None:
    """format_type is auto or one of the method's formats."""
    formats = METHOD_SPECS[method].formats
    if format_type != "auto" and format_type not in formats:
        raise ValueError(f"format_type: {format_type!r} is not a format of method {method!r}; use auto "
                         f"or {' or '.join(formats)}")


def unmeasured(config: JobConfig, metric: str, rows: int | None = None) -> tuple[str, str] | None:
    """Why this job's evaluations do not measure `metric` (as `parts.watchable_metric` names it): (the field to
    change, a sentence), or None when they do. rows: held-out rows answered for it (None: eval_generate_rows).

    Early stopping watches the metric and a sweep's objective is told it: both ask here."""
    if config.eval_steps <= 0:
        return "eval_steps", (f"{metric} needs evaluations during training: set eval_steps above 0 (held-out "
                              "rows are evaluated every eval_steps)")
    if metric in METHOD_METRICS and config.method not in METHOD_METRICS[metric]:
        return "method", (f"{metric} is a metric of method {', '.join(METHOD_METRICS[metric])}, not of "
                          f"{config.method!r}; use eval_loss or one of {', '.join(GENERATION_METRICS)}")
    if metric in GENERATION_METRICS:
        formats = set(METHOD_SPECS[config.method].formats) if config.format_type == "auto" else {config.format_type}
        if formats <= NO_REPLY_FORMATS:
            source = f"method {config.method!r}" if config.format_type == "auto" else f"format {config.format_type!r}"
            return "format_type", (f"{metric} compares generated answers with the reference replies of held-out "
                                   f"rows, and the rows of {source} have none; use eval_loss")
        if (config.eval_generate_rows if rows is None else rows) == 0:
            return "eval_generate_rows", (f"{metric} is measured on held-out rows the model answers, and "
                                          "eval_generate_rows is 0")
    return None


def check_mapping(method: str, mapping: dict[str, str] | None) -> None:
    """custom_format_mapping against the method's formats: roles for SFT, its fields for the others."""
    if mapping is None:
        return
    targets = list(mapping.values())
    spec = METHOD_SPECS[method]
    if not spec.mappings:  # columns map to chat roles
        wrong = sorted(set(targets) - ROLES)
        if wrong:
            raise ValueError(f"custom_format_mapping: method {method!r} maps columns to roles (system, "
                             f"user, assistant), not to {', '.join(wrong)}")
        return
    # the alternative meant: the first whose own fields (those not in every alternative) are all mapped
    shared = set.intersection(*(set(alt) for alt in spec.mappings))
    needed = next((alt for alt in spec.mappings if set(alt) - shared <= set(targets)), spec.mappings[0])
    allowed = {f for alt in spec.mappings for f in alt} | set(spec.optional_mappings)
    wrong = sorted(set(targets) - allowed)
    missing = [f for f in needed if f not in targets]
    if wrong or missing or len(set(targets)) != len(targets):
        raise ValueError(
            f"custom_format_mapping: method {method!r} maps columns to {', '.join(needed)}"
            + (f" (and optionally {', '.join(spec.optional_mappings)})" if spec.optional_mappings else "")
            + (f"; {', '.join(wrong)} is not one of them" if wrong else "")
            + (f"; nothing maps to {', '.join(missing)}" if missing else "")
            + ("; two columns map to one field" if len(set(targets)) != len(targets) else ""))


def check_options(cfg: BaseModel, method: str) -> None:
    """The options of other methods that cfg has (METHOD_OPTIONS) are left at their defaults."""
    fields = type(cfg).model_fields
    for name, methods in METHOD_OPTIONS.items():
        if name in fields and method not in methods and getattr(cfg, name) != fields[name].get_default(
                call_default_factory=True):
            raise ValueError(f"{name}: applies to method{'s' if len(methods) > 1 else ''} {', '.join(methods)}, "
                             f"not to method {method!r}")


def check_rows(cfg: Any, holds_out: bool, to_hold_out: str) -> None:
    """Which rows are read and held out, as a job checks them (a JobConfig, and a ReportSpec that reads as one):
    local_datasets or hf_dataset, a slice that ends after it starts, and eval_fraction / held_out_rows only for
    rows held out of the data (`holds_out`, no eval_split); `to_hold_out` says how to hold rows out."""
    if not cfg.local_datasets and not cfg.hf_dataset:
        raise ValueError("local_datasets: give local_datasets or hf_dataset; neither is set")
    if cfg.local_datasets and cfg.hf_dataset:
        raise ValueError("hf_dataset: give local_datasets or hf_dataset, not both")
    start, end = cfg.dataset_slice_start, cfg.dataset_slice_end
    if start is not None and end is not None and end < start:
        raise ValueError(f"dataset_slice_end: {end} is before dataset_slice_start {start} (both are inclusive)")
    for name in ("eval_fraction", "held_out_rows"):
        if getattr(cfg, name) is not None and (cfg.eval_split or not holds_out):
            raise ValueError(f"{name}: applies to the rows a job holds out of its data for evaluation: "
                             + ("unset eval_split" if cfg.eval_split else to_hold_out))
    if cfg.eval_fraction is not None and cfg.held_out_rows is not None:
        raise ValueError("eval_fraction: held_out_rows decides which rows are held out; unset one of them")


class DataSpec(BaseModel):
    """What a dataset preview reads of a job: its files, split, method and format (and GRPO's reward names, for
    the answer some compare with), checked as a job checks them: no model, no schedule, no fake values."""

    model_config = ConfigDict(extra="forbid")

    local_datasets: list[PathText] = Field(default_factory=list, max_length=256)
    train_split: str = "train"
    method: Method = "sft"
    format_type: FormatType = "auto"
    custom_format_mapping: dict[str, MappingTarget] | None = None
    reward_functions: list[PathText] = Field(
        default_factory=list, max_length=16,
        description="GRPO: the rows must hold what these compare with (an answer).",
    )

    @model_validator(mode="before")
    @classmethod
    def _spellings(cls, data: object) -> object:
        # normalise also fills the method's defaults (pretrain: packing); those of fields a spec has not are no
        # key of the user's, so they are left out (a key the user gave is still refused)
        normalised = normalise(data)
        if isinstance(data, dict) and isinstance(normalised, dict):
            return {k: v for k, v in normalised.items() if k in data or k in cls.model_fields}
        return normalised

    @field_validator("local_datasets")
    @classmethod
    def _each_dataset_once(cls, value: list[str]) -> list[str]:
        return unique_datasets(value)

    @model_validator(mode="after")
    def _method_rules(self) -> DataSpec:
        check_format(self.method, self.format_type)
        check_mapping(self.method, self.custom_format_mapping)
        if self.reward_functions and "reward_functions" not in METHOD_SPECS[self.method].options:
            raise ValueError(f"reward_functions: applies to method {', '.join(METHOD_OPTIONS['reward_functions'])}")
        return self


def _audio_rules(cfg: Any) -> None:
    """What a speech-to-text job cannot take: its rows are clips, its samples its held-out clips."""
    if cfg.sample_prompts:
        raise ValueError("sample_prompts: an audio job's samples are its held-out clips, transcribed before and "
                         "after training; leave sample_prompts empty")
    if cfg.packing:
        raise ValueError("packing: an audio job's rows are clips, each a window of the model's input: leave it off")
    if cfg.padding_free is True:
        raise ValueError("padding_free: an audio job's clips are padded to the model's window: leave it auto")


# Fields in the order of the parts: pydantic collects a model's fields from its bases in reverse MRO.
class JobConfig(EarlyStoppingPart, MethodPart, OutputPart, LoggingPart, SeedMediaPart, AdapterPart, OptimisationPart,
                DataPart, ModelPart):
    """One fine-tuning job. Unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", validate_default=True, use_enum_values=False, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _spellings(cls, data: Any) -> Any:
        return normalise(data)

    @model_validator(mode="after")
    def _method_rules(self) -> JobConfig:
        """Options of other methods, the method's formats, mappings and its own checks; no I/O."""
        spec = METHOD_SPECS[self.method]
        check_options(self, self.method)
        check_format(self.method, self.format_type)
        check_mapping(self.method, self.custom_format_mapping)
        if spec.check is not None:
            spec.check(self)
        return self

    @model_validator(mode="after")
    def _early_stopping_rules(self) -> JobConfig:
        """The watched metric is one this job measures; keep_best and the rows apply with early stopping only."""
        stopping = self.early_stopping
        if stopping is None:
            if not self.keep_best:
                raise ValueError("keep_best: applies with early_stopping (its metric says which step is best)")
            if self.early_stopping_rows is not None:
                raise ValueError("early_stopping_rows: applies with early_stopping only")
            return self
        metric = stopping.metric
        problem = unmeasured(self, metric, self.early_stopping_rows)
        if problem is not None:
            field, why = problem
            named = {"eval_steps": "early_stopping", "eval_generate_rows": "early_stopping_rows"}
            advice = ": set early_stopping_rows" if field == "eval_generate_rows" else ""
            raise ValueError(f"{named.get(field, 'early_stopping.metric')}: {why}{advice}")
        if not stopping.generates and self.early_stopping_rows is not None:
            raise ValueError(f"early_stopping_rows: applies to a generation metric ({', '.join(GENERATION_METRICS)}), "
                             f"not to {metric}")
        return self

    @model_validator(mode="after")
    def _consistent(self) -> JobConfig:
        if self.training_type is TrainingType.full:
            # The seed does the same: full fine-tuning never loads 4-bit weights.
            self.load_in_4bit = False
        elif self.training_type is TrainingType.qlora:
            self.load_in_4bit = True
        elif self.load_in_4bit:
            raise ValueError("load_in_4bit: 4-bit weights need training_type 'qlora' (got 'lora')")

        check_rows(self, holds_out=self.eval_steps > 0, to_hold_out="set eval_steps above 0")
        if self.warmup_steps is not None and self.warmup_ratio is not None:
            raise ValueError("warmup_ratio: set warmup_steps or warmup_ratio, not both")
        if self.use_loftq and self.training_type is not TrainingType.lora:
            raise ValueError(
                "use_loftq: LoftQ initialises LoRA weights from full-precision layers; use training_type 'lora'"
            )
        if self.modality not in TRAINED_MODALITIES:
            raise ValueError(f"is_dataset_{self.modality}: {self.modality} datasets are not supported yet "
                             f"(this release trains {', '.join(TRAINED_MODALITIES)} data)")
        if self.modality not in METHOD_SPECS[self.method].modalities:
            raise ValueError(f"method: {self.method} trains {' or '.join(METHOD_SPECS[self.method].modalities)} data, "
                             f"not {self.modality} data (is_dataset_{self.modality} is set)")
        if self.modality == "audio":
            _audio_rules(self)
        elif self.audio_language is not None or self.audio_task != "transcribe":
            raise ValueError(f"{'audio_language' if self.audio_language is not None else 'audio_task'}: applies to "
                             "audio jobs (is_dataset_audio)")
        if self.modality == "text" and not self.finetune_language_layers:
            raise ValueError("finetune_language_layers: a text model has language layers only; leave it on (the "
                             "vision switches are for image datasets, is_dataset_image)")
        if self.modality == "image" and not (self.finetune_vision_layers or self.finetune_language_layers):
            raise ValueError("finetune_vision_layers: at least one of finetune_vision_layers and "
                             "finetune_language_layers must be true")
        if not (self.finetune_attention_modules or self.finetune_mlp_modules):
            raise ValueError(
                "finetune_attention_modules: at least one of finetune_attention_modules and "
                "finetune_mlp_modules must be true"
            )
        if self.custom_format_mapping is not None and not METHOD_SPECS[self.method].mappings:  # columns to roles
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


