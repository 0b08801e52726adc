"""`JobConfig`: one fine-tuning job, composed of its parts (model, data, optimisation, adapters, outputs,
method), each a pydantic model of its fields; the whole is validated once.

The model is pure: validators never touch the filesystem, so `JobConfig.model_validate(c.public_dict() |
c.secrets()) == c` (tests/test_config.py checks it on generated configs). Derived fields: in `_consistent`,
`load_in_4bit` follows `training_type`; in `LoggingPart._trackers`, `report_to`'s wandb and tensorboard turn
`enable_wandb` and `enable_tensorboard` on. Paths are made absolute and checked in an explicit
step, `tunestudio.paths`. Every number has bounds, and NaN or infinity is refused.
"""

from __future__ import annotations

from pathlib import PurePath
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from tunestudio.config.methods import METHOD_OPTIONS, METHOD_SPECS
from tunestudio.config.seed import normalise
from tunestudio.config.vocabulary import (
    GENERATION_METRICS,
    MAX_ROWS,
    MAX_STEPS,
    SECRET_FIELDS,
    DpoLoss,
    FormatType,
    LrScheduler,
    MappingTarget,
    Method,
    Optimizer,
    ReportTarget,
    TrainingType,
)

__all__ = ["EarlyStopping", "JobConfig"]

_ROLES = {"system", "user", "assistant"}


class ModelPart(BaseModel):
    """Which model, how it is loaded."""

    model_name: str = Field(min_length=1, description="Local model folder or a hub model id.")
    training_type: TrainingType = TrainingType.lora
    load_in_4bit: bool = Field(
        default=False, description="4-bit weights; true exactly when training_type is qlora."
    )
    max_seq_length: int = Field(default=2048, ge=8, le=1_048_576)
    hf_token: SecretStr | None = None
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"

    @field_validator("model_name")
    @classmethod
    def _model_name_stripped(cls, value: str) -> str:
        value = value.strip()
        if not value:
            raise ValueError("model_name is empty")
        return value


class DataPart(BaseModel):
    """Which rows, in which format, and the held-out split."""

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
    dedupe: Literal["off", "exact", "near"] = Field(
        default="off",
        description="Duplicate rows removed before the eval split, the first of each kept: exact (the same after "
                    "normalising whitespace), or near (also rows whose word 3-grams overlap by an estimated "
                    "Jaccard of 0.8 or more: MinHash LSH).",
    )
    eval_fraction: float | None = Field(
        default=None, gt=0, lt=1,
        description="Without eval_split: the share of the rows held out for evaluation (eval_steps > 0), at least "
                    "one, and one left to train; seeded by random_seed. null: 5%, 16 to 128 rows, none under 32.",
    )
    held_out_rows: str | None = Field(
        default=None,
        description="The held_out.json an earlier job wrote in its output folder: hold out exactly its rows again "
                    "(a resume and a clone do), matched by content; the job fails naming the rows its data no "
                    "longer has. null: a new split, seeded by random_seed. Needs eval_steps > 0 and no eval_split.",
    )

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

    @field_validator("eval_steps")
    @classmethod
    def _whole_steps(cls, value: float) -> float:
        if value >= 1 and value != int(value):
            raise ValueError("eval_steps of 1 or more is a number of steps and must be whole")
        return value


class OptimisationPart(BaseModel):
    """The schedule, the optimizer, and the ranks that share the work."""

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

    num_processes: int = Field(
        default=1,
        ge=1,
        le=256,
        description="Data-parallel ranks; above 1 the job runs under torchrun (gloo on a CPU, nccl on GPUs). "
        "batch_size is per rank: the global batch is batch_size x gradient_accumulation_steps x num_processes.",
    )



class AdapterPart(BaseModel):
    """LoRA's shape and what is trained."""

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



class SeedMediaPart(BaseModel):
    """The seed's vision and audio fields (text models only for now)."""

    is_dataset_image: bool = False
    is_dataset_audio: bool = False
    finetune_vision_layers: bool = True
    finetune_language_layers: bool = True
    finetune_attention_modules: bool = True
    finetune_mlp_modules: bool = True



class LoggingPart(BaseModel):
    """The logging integrations."""

    enable_wandb: bool = False
    wandb_token: SecretStr | None = None
    wandb_project: str = "tunestudio"
    enable_tensorboard: bool = False
    tensorboard_dir: str = Field(
        default="runs", min_length=1, description="TensorBoard event files; relative: inside output_dir."
    )
    report_to: list[ReportTarget] = Field(
        default_factory=list, max_length=10,
        description="Experiment trackers: mlflow (params, per-step metrics, the evaluation and where the artefacts "
                    "are, into mlflow_tracking_uri), wandb and tensorboard (the same as enable_wandb and "
                    "enable_tensorboard, which they turn on).",
    )
    mlflow_tracking_uri: str | None = Field(
        default=None, max_length=2000,
        description="With report_to mlflow: the tracking store; unset: TUNESTUDIO_MLFLOW_URI, else a SQLite store "
                    "in the data directory (filled in at submit).",
    )
    mlflow_experiment: str = Field(default="tunestudio", min_length=1, max_length=500,
                                   description="With report_to mlflow: the experiment the job's run goes into.")
    mlflow_run_name: str | None = Field(default=None, max_length=250,
                                        description="With report_to mlflow: the run's name; unset: MLflow's.")
    mlflow_parent_run_id: str | None = Field(
        default=None, max_length=64, pattern=r"^[0-9a-zA-Z_-]+$",
        description="With report_to mlflow: the run this job's run is a child of (a sweep sets it for its trials).",
    )

    @field_validator("report_to")
    @classmethod
    def _once_each(cls, value: list[str]) -> list[str]:
        return list(dict.fromkeys(value))

    @model_validator(mode="after")
    def _trackers(self) -> LoggingPart:
        # report_to's wandb and tensorboard are the older switches' other spelling: the switches follow them
        if "wandb" in self.report_to:
            self.enable_wandb = True
        if "tensorboard" in self.report_to:
            self.enable_tensorboard = True
        if "mlflow" not in self.report_to:
            for name in ("mlflow_tracking_uri", "mlflow_run_name", "mlflow_parent_run_id"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name}: applies with report_to mlflow only")
        return self



class OutputPart(BaseModel):
    """Where the artefacts go, resume, and what is compared before and after."""

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



class MethodPart(BaseModel):
    """The training method (methods.METHOD_SPECS) and the options of some methods only."""

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



# The methods' own metrics as early stopping names them: measured on the eval split, so "eval_" + TRL's name.
_METHOD_METRICS: dict[str, tuple[str, ...]] = {}
for _name, _spec in METHOD_SPECS.items():
    if _spec.main_metric:
        _METHOD_METRICS[f"eval_{_spec.main_metric}"] = (*_METHOD_METRICS.get(f"eval_{_spec.main_metric}", ()), _name)
_NO_REPLY_FORMATS = {"text", "prompt_only"}  # rows without a reference reply: nothing to compare answers with


class EarlyStopping(BaseModel):
    """Stop when the eval metric has not improved for `patience` evaluations (worker/best.py)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    metric: str = Field(
        default="eval_loss", max_length=100,
        description="eval_loss; exact_match, token_f1 or rouge_l (answers generated for held-out rows at each "
                    "evaluation); or the method's metric on the eval split (dpo, orpo, kto: eval_rewards/margins; "
                    "grpo: eval_reward).",
    )
    patience: int = Field(default=3, ge=1, le=100_000,
                          description="Evaluations in a row without an improvement before the job stops.")
    min_delta: float = Field(default=0.0, ge=0, le=1e9,
                             description="An improvement counts when it is larger than this.")
    mode: Literal["auto", "min", "max"] = Field(
        default="auto", description="Whether lower (min) or higher (max) is better; auto: min for eval_loss, "
                                    "max for the others.")

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, value: str) -> str:
        value = value.strip()
        name = value.removeprefix("eval_")
        if name in GENERATION_METRICS:
            return name
        if value == "eval_loss" or f"eval_{name}" in _METHOD_METRICS:
            return f"eval_{name}"
        known = ["eval_loss", *GENERATION_METRICS, *_METHOD_METRICS]
        raise ValueError(f"{value!r} is not a metric early stopping can watch; use one of {', '.join(known)}")

    @property
    def direction(self) -> Literal["min", "max"]:
        """Which way is better (mode, or the metric's own way for auto)."""
        if self.mode != "auto":
            return self.mode
        return "min" if self.metric == "eval_loss" else "max"

    @property
    def generates(self) -> bool:
        """Whether the metric is measured on answers generated at each evaluation."""
        return self.metric in GENERATION_METRICS


class EarlyStoppingPart(BaseModel):
    """Early stopping and keep-best: the job watches one eval metric, stops when it stalls, keeps its best."""

    early_stopping: EarlyStopping | None = Field(
        default=None,
        description='{metric, patience, min_delta, mode}, e.g. {"metric": "exact_match", "patience": 3}; needs '
                    "eval_steps > 0. null: train to the end.",
    )
    keep_best: bool = Field(
        default=True,
        description="With early_stopping: save a checkpoint at each improvement and make the job's artefacts the "
                    "best step's weights; false: the last step's.",
    )
    early_stopping_rows: int | None = Field(
        default=None, ge=1, le=1000,
        description="For a generation metric: held-out rows answered at each evaluation; unset: "
                    "eval_generate_rows.",
    )


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
        for name, methods in METHOD_OPTIONS.items():
            default = type(self).model_fields[name].get_default(call_default_factory=True)
            if self.method not in methods and getattr(self, name) != default:
                raise ValueError(f"{name}: applies to method{'s' if len(methods) > 1 else ''} {', '.join(methods)}, "
                                 f"not to method {self.method!r}")
        if self.format_type != "auto" and self.format_type not in spec.formats:
            raise ValueError(f"format_type: {self.format_type!r} is not a format of method {self.method!r}; use auto "
                             f"or {' or '.join(spec.formats)}")
        self._check_mapping()
        if spec.check is not None:
            spec.check(self)
        return self

    def _check_mapping(self) -> None:
        mapping = self.custom_format_mapping
        if mapping is None:
            return
        targets = list(mapping.values())
        spec = METHOD_SPECS[self.method]
        if not spec.mappings:  # columns map to chat roles
            wrong = sorted(set(targets) - _ROLES)
            if wrong:
                raise ValueError(f"custom_format_mapping: method {self.method!r} maps columns to roles (system, "
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
                f"custom_format_mapping: method {self.method!r} maps columns to {', '.join(needed)}"
                + (f" (and optionally {', '.join(spec.optional_mappings)})" if spec.optional_mappings else "")
                + (f"; {', '.join(wrong)} is not one of them" if wrong else "")
                + (f"; nothing maps to {', '.join(missing)}" if missing else "")
                + ("; two columns map to one field" if len(set(targets)) != len(targets) else ""))

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
        if self.eval_steps <= 0:
            raise ValueError("early_stopping: needs evaluations during training: set eval_steps above 0 (held-out "
                             "rows are evaluated every eval_steps)")
        metric = stopping.metric
        if metric in _METHOD_METRICS and self.method not in _METHOD_METRICS[metric]:
            raise ValueError(f"early_stopping.metric: {metric} is a metric of method "
                             f"{', '.join(_METHOD_METRICS[metric])}, not of {self.method!r}; use eval_loss or one of "
                             f"{', '.join(GENERATION_METRICS)}")
        if stopping.generates:
            formats = (set(METHOD_SPECS[self.method].formats) if self.format_type == "auto"
                       else {self.format_type})
            if formats <= _NO_REPLY_FORMATS:
                rows = f"method {self.method!r}" if self.format_type == "auto" else f"format {self.format_type!r}"
                raise ValueError(f"early_stopping.metric: {metric} compares generated answers with the reference "
                                 f"replies of held-out rows, and the rows of {rows} have none; use eval_loss")
            if self.early_stopping_rows is None and self.eval_generate_rows == 0:
                raise ValueError(f"early_stopping_rows: {metric} is measured on held-out rows answered at each "
                                 "evaluation, and eval_generate_rows is 0: set early_stopping_rows")
        elif self.early_stopping_rows is not None:
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
        for name in ("eval_fraction", "held_out_rows"):
            if getattr(self, name) is not None and (self.eval_split or self.eval_steps <= 0):
                raise ValueError(f"{name}: applies to the rows a job holds out of its data for evaluation: "
                                 + ("unset eval_split" if self.eval_split else "set eval_steps above 0"))
        if self.eval_fraction is not None and self.held_out_rows is not None:
            raise ValueError("eval_fraction: held_out_rows decides which rows are held out; unset one of them")
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


