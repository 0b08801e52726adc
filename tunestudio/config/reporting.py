"""What a job reports and keeps, the rest of the parts a `JobConfig` is composed of (config/parts.py has the
others): the logging integrations, the outputs and the samples compared before and after, and early stopping
with the metrics a job's evaluations measure.

Pure, like JobConfig: no validator touches the filesystem.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from tunestudio.config.methods import METHOD_SPECS
from tunestudio.config.vocabulary import GENERATION_METRICS, PathText, ReportTarget


class LoggingPart(BaseModel):
    """The logging integrations."""

    enable_wandb: bool = Field(
        default=False, title="Weights & Biases", description="Send metrics to W&B (needs its token).",
        json_schema_extra={"group": "logging"},
    )
    wandb_token: SecretStr | None = Field(
        default=None, title="W&B token", description="Used for this job only; never stored.",
        json_schema_extra={"group": "logging"},
    )
    wandb_project: str = Field(
        default="tunestudio", title="W&B project", description="The W&B project the run goes to.",
        json_schema_extra={"group": "logging"},
    )
    enable_tensorboard: bool = Field(
        default=False, title="TensorBoard", description="Write TensorBoard event files.",
        json_schema_extra={"group": "logging"},
    )
    tensorboard_dir: PathText = Field(
        default="runs", min_length=1, description="TensorBoard event files; relative: inside output_dir.",
        title="TensorBoard folder",
        json_schema_extra={"group": "logging", "help": "Relative: inside the output folder."},
    )
    report_to: list[ReportTarget] = Field(
        default_factory=list, max_length=10,
        description="Experiment trackers: mlflow (params, per-step metrics, the evaluation and where the artefacts "
                    "are, into mlflow_tracking_uri), wandb and tensorboard (the same as enable_wandb and "
                    "enable_tensorboard, which they turn on).",
        title="Report to",
        json_schema_extra={"group": "logging", "help": "Experiment trackers, one a line: mlflow, wandb, tensorboard."},
    )
    mlflow_tracking_uri: PathText | None = Field(
        default=None, max_length=2000,
        description="With report_to mlflow: the tracking store; unset: TUNESTUDIO_MLFLOW_URI, else a SQLite store "
                    "in the data directory (filled in at submit).",
        title="MLflow store",
        json_schema_extra={"group": "logging", "help": "An http(s) tracking server; empty: the studio's own store."},
    )
    mlflow_experiment: str = Field(
        default="tunestudio", min_length=1, max_length=500,
        description="With report_to mlflow: the experiment the job's run goes into.", title="MLflow experiment",
        json_schema_extra={"group": "logging", "help": "The experiment the job's run goes into."},
    )
    mlflow_run_name: str | None = Field(
        default=None, max_length=250, description="With report_to mlflow: the run's name; unset: MLflow's.",
        title="MLflow run name", json_schema_extra={"group": "logging", "help": "Empty: MLflow names the run."},
    )
    mlflow_parent_run_id: str | None = Field(
        default=None, max_length=64, pattern=r"^[0-9a-zA-Z_-]+$",
        description="With report_to mlflow: the run this job's run is a child of (a sweep sets it for its trials).",
        title="MLflow parent run",
        json_schema_extra={"group": "logging", "help": "The run this one nests under (a sweep sets it)."},
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

    output_dir: PathText | None = Field(
        default=None, description="Where artefacts go; set by the launcher if unset.", title="Output folder",
        json_schema_extra={"group": "logging", "help": "Where the result goes; empty: the job's own folder."},
    )
    resume_from_checkpoint: PathText | None = Field(
        default=None, description='A checkpoint folder, or "latest" in output_dir.', title="Resume from checkpoint",
        json_schema_extra={"group": "logging", "help": "A checkpoint folder, or 'latest' in the output folder."},
    )
    sample_prompts: list[str] = Field(
        default_factory=list,
        description="Prompts generated from before and after training, to compare base and result.", max_length=16,
        title="Sample prompts (one a line)",
        json_schema_extra={"group": "logging", "help": "Prompts answered before and after training, one a line."},
    )
    eval_generate_rows: int = Field(
        default=32, ge=0, le=1000,
        description="Held-out rows the base and the trained model answer, for exact match, token F1 and ROUGE-L "
                    "(needs an eval split: eval_steps > 0); 0: loss only.",
        title="Eval Generate Rows", json_schema_extra={"group": "other"},
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
        title="Early stopping (JSON)", examples=[{"metric": "exact_match", "patience": 3}],
        json_schema_extra={"group": "evaluation",
                           "help": 'Stop when the eval metric stalls, e.g. {"metric": "exact_match", "patience": 3, '
                                   '"min_delta": 0.01}; metric: eval_loss, exact_match, token_f1, rouge_l or the '
                                   "method's (eval_rewards/margins). Needs Eval every > 0."},
    )
    keep_best: bool = Field(
        default=True,
        description="With early_stopping: save a checkpoint at each improvement and make the job's artefacts the "
                    "best step's weights; false: the last step's.",
        title="Keep the best checkpoint",
        json_schema_extra={"group": "evaluation",
                           "help": "With early stopping: the job's result is the best evaluation's weights, not the "
                                   "last step's."},
    )
    early_stopping_rows: int | None = Field(
        default=None, ge=1, le=1000,
        description="For a generation metric: held-out rows answered at each evaluation; unset: "
                    "eval_generate_rows.",
        title="Early stopping rows",
        json_schema_extra={"group": "evaluation",
                           "help": "Held-out rows answered at each evaluation for exact_match, token_f1 or rouge_l; "
                                   "empty: as the evaluation."},
    )
