"""The parts a `JobConfig` is composed of, one pydantic model per concern (model, data, optimisation,
adapters, media, logging, outputs, method, early stopping), and the checks a part of a job needs on its own
are in job.py beside JobConfig.

Pure, like JobConfig: no validator touches the filesystem.
"""

from __future__ import annotations

from pathlib import PurePath
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from tunestudio.config.methods import METHOD_SPECS
from tunestudio.config.vocabulary import (
    GENERATION_METRICS,
    MAX_ROWS,
    MAX_STEPS,
    DpoLoss,
    FormatType,
    LrScheduler,
    MappingTarget,
    Method,
    Modality,
    Optimizer,
    ReportTarget,
    TrainingType,
)


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


def unique_datasets(value: list[str]) -> list[str]:
    """local_datasets with no entry twice (compared as written, normalised; no filesystem)."""
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
        return unique_datasets(value)

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
    """The seed's vision and audio fields: they name the job's kind of data (`modality`, worker/modalities/)."""

    is_dataset_image: bool = False
    is_dataset_audio: bool = False
    finetune_vision_layers: bool = True
    finetune_language_layers: bool = True
    finetune_attention_modules: bool = True
    finetune_mlp_modules: bool = True

    @property
    def modality(self) -> Modality:
        """The job's kind of data, from the seed's flags: the worker's modality object of that name runs it."""
        return "image" if self.is_dataset_image else "audio" if self.is_dataset_audio else "text"



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
METHOD_METRICS: dict[str, tuple[str, ...]] = {}
for _name, _spec in METHOD_SPECS.items():
    if _spec.main_metric:
        METHOD_METRICS[f"eval_{_spec.main_metric}"] = (*METHOD_METRICS.get(f"eval_{_spec.main_metric}", ()), _name)
NO_REPLY_FORMATS = {"text", "prompt_only"}  # rows without a reference reply: nothing to compare answers with


def watchable_metric(value: str) -> str:
    """A metric a job's evaluations measure, by the name early stopping and a sweep's objective use: eval_loss,
    a generation metric (bare: exact_match), or a method's metric (eval_rewards/margins); ValueError otherwise."""
    value = value.strip()
    name = value.removeprefix("eval_")
    if name in GENERATION_METRICS:
        return name
    if value == "eval_loss" or f"eval_{name}" in METHOD_METRICS:
        return f"eval_{name}"
    known = ["eval_loss", *GENERATION_METRICS, *METHOD_METRICS]
    raise ValueError(f"{value!r} is not a metric a job's evaluations measure; use one of {', '.join(known)}")


class EarlyStopping(BaseModel):
    """Stop when the eval metric has not improved for `patience` evaluations (worker/train/best.py)."""

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
        return watchable_metric(value)

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
