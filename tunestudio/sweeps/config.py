"""A sweep: a base JobConfig, a search space over its fields, a sampler, an objective, a pruner and a budget.

The same shape is the sweep file (`tunestudio sweep SWEEP.yaml`) and the body of `POST /api/sweeps`. Pure data:
validating it checks the space against JobConfig's fields and the base (with the space's first point) as a job.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tunestudio.config import JobConfig, field_errors, summary

# What an objective may name: the eval loss, a generation metric of the evaluation, or the method's eval metric.
GENERATION_METRICS = ("exact_match", "token_f1", "rouge_l")


class Values(BaseModel):
    """A categorical (or grid) dimension: one of these values."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    # What Optuna's categorical takes: plain values (a list or a mapping would fail at the first ask).
    values: list[bool | int | float | str | None] = Field(min_length=1, max_length=1000)


class FloatRange(BaseModel):
    """A float in [low, high]; log: sampled on a log scale (low > 0)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    low: float
    high: float
    log: bool = False

    @model_validator(mode="after")
    def _ordered(self) -> FloatRange:
        if not self.low < self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        if self.log and self.low <= 0:
            raise ValueError(f"a log range needs low > 0 (low is {self.low})")
        return self


class IntRange(BaseModel):
    """An integer in [low, high], every `step`."""

    model_config = ConfigDict(extra="forbid")
    low: int
    high: int
    step: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> IntRange:
        if not self.low < self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        return self


Dimension = Values | IntRange | FloatRange


def parse_dimension(name: str, spec: Any) -> Dimension:
    """One field's dimension: {values}, {low, high, step} (int) or {low, high, log} (float); errors name it."""
    if not isinstance(spec, dict):
        raise ValueError(f"space.{name}: expected {{values: [...]}}, {{low, high, log}} or {{low, high, step}}")
    if name not in JobConfig.model_fields:
        raise ValueError(f"space.{name}: JobConfig has no field {name!r}")
    if "values" in spec:
        kind: type[BaseModel] = Values
    elif "step" in spec or (isinstance(spec.get("low"), int) and isinstance(spec.get("high"), int)
                            and not spec.get("log")):
        kind = IntRange
    else:
        kind = FloatRange
    try:
        return kind.model_validate(spec)
    except ValidationError as exc:
        raise ValueError(f"space.{name}: {summary(field_errors(exc.errors()), unnamed='range')}") from None


class Objective(BaseModel):
    model_config = ConfigDict(extra="forbid")
    metric: str = Field(default="eval_loss", max_length=100,
                        description="eval_loss, exact_match, token_f1, rouge_l, or an eval_ metric of the method.")
    mode: Literal["min", "max"] | None = Field(default=None, description="None: min for eval_loss, max otherwise.")

    @field_validator("metric")
    @classmethod
    def _known(cls, value: str) -> str:
        value = value.strip()
        name = value.removeprefix("eval_")
        if name in GENERATION_METRICS:
            return name
        if value.startswith("eval_") and name:
            return value
        raise ValueError(f"{value!r}: use eval_loss, {', '.join(GENERATION_METRICS)} or an eval_ metric")

    @property
    def direction(self) -> Literal["minimize", "maximize"]:
        mode = self.mode or ("min" if self.metric == "eval_loss" else "max")
        return "minimize" if mode == "min" else "maximize"

    @property
    def record_key(self) -> str:
        """The metric's name in a job's metric records (eval_loss is a column; the others are in `extra`)."""
        return self.metric if self.metric.startswith("eval_") else f"eval_{self.metric}"


class SweepConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base: dict[str, Any] = Field(description="Any JobConfig fields: what every trial shares.")
    space: dict[str, Any] = Field(min_length=1, max_length=50,
                                  description="Per JobConfig field: {values}, {low, high, log} or {low, high, step}.")
    sampler: Literal["grid", "random", "tpe"] = "tpe"
    n_trials: int = Field(default=10, ge=1, le=10_000)
    objective: Objective = Field(default_factory=Objective)
    pruner: Literal["none", "median", "halving"] = "none"
    parallel: int | None = Field(default=None, ge=1, le=64, description="Trials at once; None: the queue's slots.")
    seed: int | None = Field(default=None, description="The sampler's seed.")

    @model_validator(mode="after")
    def _consistent(self) -> SweepConfig:
        # Whole-model errors name their field first ("space.lora_r: ..."), so a 422 names the field itself.
        self.space = {name: parse_dimension(name, spec).model_dump() for name, spec in self.space.items()}
        swept = set(self.space) & set(self.base)
        if swept:
            raise ValueError(f"base: {', '.join(sorted(swept))} also in the space; set it in one place")
        if self.sampler == "grid":
            ranges = [n for n, d in self.dimensions().items() if not isinstance(d, Values)]
            if ranges:
                raise ValueError(f"space.{ranges[0]}: the grid sampler needs {{values: [...]}}")
        try:
            self.trial_config(self.first_point())
        except ValidationError as exc:
            raise ValueError(f"base: {summary(field_errors(exc.errors()))}") from None
        return self

    def dimensions(self) -> dict[str, Dimension]:
        return {name: parse_dimension(name, spec) for name, spec in self.space.items()}

    def first_point(self) -> dict[str, Any]:
        return {name: d.values[0] if isinstance(d, Values) else d.low for name, d in self.dimensions().items()}

    def grid_size(self) -> int:
        return math.prod(len(d.values) for d in self.dimensions().values() if isinstance(d, Values))

    @property
    def budget(self) -> int:
        """Trials to run: n_trials, or fewer when a grid has fewer points."""
        return min(self.n_trials, self.grid_size()) if self.sampler == "grid" else self.n_trials

    def trial_config(self, params: dict[str, Any], number: int | None = None) -> JobConfig:
        """A trial's job: the base with the params; a base output_dir gets one folder per trial."""
        fields = {**self.base, **params}
        if number is not None and fields.get("output_dir"):
            fields["output_dir"] = f"{str(fields['output_dir']).rstrip('/')}/trial-{number}"
        return JobConfig.model_validate(fields)
