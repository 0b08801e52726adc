"""A sweep's search space: per JobConfig field, a typed dimension ({values}, an integer or a float range).

`parse_dimension` picks a field's kind from its shape and the field's type (a range only on a number field, a
float range not on an integer one, never a secret) and validates it once; `SweepConfig.space` keeps the result
typed. `Point`: a point of the space with the job it makes, validated once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tunestudio.config import SECRET_FIELDS, JobConfig, field_errors, summary

MAX_VALUES = 1000  # categorical values in a whole space: each is validated (and, through the API, confined) as a job


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
    if isinstance(spec, (Values, IntRange, FloatRange)):  # typed already: checked against the field again
        spec = spec.model_dump()
    if not isinstance(spec, dict):
        raise ValueError(f"space.{name}: expected {{values: [...]}}, {{low, high, log}} or {{low, high, step}}")
    if name not in JobConfig.model_fields:
        raise ValueError(f"space.{name}: JobConfig has no field {name!r}")
    if name in SECRET_FIELDS:  # its values would be the trials' params: stored in the study, shown in every answer
        raise ValueError(f"space.{name}: {name} is a secret and cannot be swept; set it in base (kept in memory "
                         "only)")
    if "values" in spec:
        kind: type[Dimension] = Values
    elif "step" in spec or (isinstance(spec.get("low"), int) and isinstance(spec.get("high"), int)
                            and not spec.get("log")):
        kind = IntRange
    else:
        kind = FloatRange
    numbers = _number_types(name)
    if kind is not Values and not numbers:
        raise ValueError(f"space.{name}: {name} is not a number; use {{values: [...]}}")
    if kind is FloatRange and float not in numbers:
        # Optuna would draw 3.7 for lora_r; the trial's job would be refused, or silently another number
        raise ValueError(f"space.{name}: {name} is an integer; use {{low, high, step}} with whole numbers")
    try:
        return kind.model_validate(spec)
    except ValidationError as exc:
        raise ValueError(f"space.{name}: {summary(field_errors(exc.errors()), unnamed='range')}") from None


def _number_types(name: str) -> set[type]:
    """Which of int and float JobConfig's field takes (bool is not a number here)."""
    annotation = JobConfig.model_fields[name].annotation
    return {t for t in (get_args(annotation) or (annotation,)) if t in (int, float)}


Param = bool | int | float | str | None  # what a dimension draws (Optuna's categorical takes these)


@dataclass(frozen=True)
class Point:
    """A point of the space (`params`), the dimension it varies from the first point (None: the first), and its
    trial's job (the base with the params), validated once when the sweep is."""

    varied: str | None
    params: dict[str, Param]
    job: JobConfig


def highest(dim: IntRange) -> int:
    """The highest integer Optuna draws from the range (high itself when the step lands on it)."""
    return dim.low + (dim.high - dim.low) // dim.step * dim.step
