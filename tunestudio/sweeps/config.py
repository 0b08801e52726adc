"""A sweep: a base JobConfig, a search space over its fields, a sampler, an objective, a pruner and a budget.

The same shape is the sweep file (`tunestudio sweep SWEEP.yaml`) and the body of `POST /api/sweeps`. Pure data:
validating it checks the space against JobConfig's fields (a range only on a number field, a float range not on
an integer one), every value of the space as a job (`points`: the base with each value in turn) and the
objective against what those jobs measure (`config.unmeasured`, early stopping's rules).

Secrets (`hf_token`, `wandb_token`) are taken out of `base` as it is validated and kept in memory only: no dump
of a SweepConfig (the study's file, a response) holds them; `trial_config` hands them to each trial, whose job
gives them to its worker through the secrets channel. A space may not vary one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from tunestudio import paths
from tunestudio.config import SECRET_FIELDS, JobConfig, field_errors, summary
from tunestudio.config.job import unmeasured
from tunestudio.config.parts import watchable_metric
from tunestudio.paths import Roots
from tunestudio.sweeps.errors import SecretsNeeded

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
    if not isinstance(spec, dict):
        raise ValueError(f"space.{name}: expected {{values: [...]}}, {{low, high, log}} or {{low, high, step}}")
    if name not in JobConfig.model_fields:
        raise ValueError(f"space.{name}: JobConfig has no field {name!r}")
    if name in SECRET_FIELDS:  # its values would be the trials' params: stored in the study, shown in every answer
        raise ValueError(f"space.{name}: {name} is a secret and cannot be swept; set it in base (kept in memory "
                         "only)")
    if "values" in spec:
        kind: type[BaseModel] = Values
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


class Objective(BaseModel):
    model_config = ConfigDict(extra="forbid")
    metric: str = Field(default="eval_loss", max_length=100,
                        description="eval_loss, exact_match, token_f1, rouge_l, or an eval_ metric of the method.")
    mode: Literal["min", "max"] | None = Field(default=None, description="None: min for eval_loss, max otherwise.")

    @field_validator("metric")
    @classmethod
    def _known(cls, value: str) -> str:
        return watchable_metric(value)  # the names early stopping watches: the same records, the same rules

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
    # The base's secrets, by field: in memory only (a private attribute is in no dump; a copy keeps it).
    # _needed: the secret fields the trials need (a restarted server's study names them; `give_secrets` again).
    _secrets: dict[str, SecretStr] = PrivateAttr(default_factory=dict)
    _needed: frozenset[str] = PrivateAttr(default=frozenset())

    @model_validator(mode="after")
    def _consistent(self) -> SweepConfig:
        # Whole-model errors name their field first ("space.lora_r: ..."), so a 422 names the field itself.
        self._take_secrets()
        self.space = {name: parse_dimension(name, spec).model_dump() for name, spec in self.space.items()}
        swept = set(self.space) & set(self.base)
        if swept:
            raise ValueError(f"base: {', '.join(sorted(swept))} also in the space; set it in one place")
        if self.sampler == "grid":
            ranges = [n for n, d in self.dimensions().items() if not isinstance(d, Values)]
            if ranges:
                raise ValueError(f"space.{ranges[0]}: the grid sampler needs {{values: [...]}}")
        values = sum(len(d.values) for d in self.dimensions().values() if isinstance(d, Values))
        if values > MAX_VALUES:
            raise ValueError(f"space: {values} values in all; at most {MAX_VALUES}")
        for varied, params in self.points():
            self._check_point(varied, params)
        return self

    def _take_secrets(self) -> None:
        """Move the base's secrets out of `base` (which the study stores) into memory."""
        for name in SECRET_FIELDS:
            value = self.base.get(name)
            if value is not None and not isinstance(value, (str, SecretStr)):
                raise ValueError(f"base.{name}: a secret is text, not {type(value).__name__}")
            if value is not None:
                self._secrets[name] = value if isinstance(value, SecretStr) else SecretStr(value)
        self._needed = frozenset(self._secrets)
        self.base = {k: v for k, v in self.base.items() if k not in SECRET_FIELDS}

    @property
    def secret_fields(self) -> list[str]:
        """The secret fields the sweep's trials need (names only: safe to store and show)."""
        return sorted(self._needed)

    @property
    def missing_secrets(self) -> list[str]:
        """Secret fields the trials need that this process does not hold (a restarted server's sweep)."""
        return sorted(self._needed - self._secrets.keys())

    def expect_secrets(self, names: Iterable[str]) -> None:
        """A config read back from its study: the trials need these secrets (whose values were never stored)."""
        self._needed = frozenset(self._needed | {n for n in names if n in SECRET_FIELDS})

    def give_secrets(self, secrets: Mapping[str, SecretStr]) -> None:
        """Hold these secrets again (only fields the sweep needs)."""
        unknown = sorted(set(secrets) - self._needed)
        if unknown:
            raise ValueError(f"{unknown[0]}: the sweep's base did not set {unknown[0]}")
        self._secrets.update(secrets)

    def _check_point(self, varied: str | None, params: dict[str, Any]) -> None:
        """One point as a job, and the objective measured by it; an error names the swept field at fault."""
        try:
            config = self.trial_config(params)
        except ValidationError as exc:
            errors = field_errors(exc.errors())
            # the first point passed, so a later point's fault is the value it varies
            at_fault = varied or next((e["field"].split(".")[0] for e in errors if e["field"].split(".")[0] in params),
                                      None)
            if at_fault is None:
                raise ValueError(f"base: {summary(errors)}") from None
            raise ValueError(f"space.{at_fault}: the value {params[at_fault]!r} makes an invalid job: "
                             f"{summary(errors)}") from None
        stopping = config.early_stopping
        rows = config.early_stopping_rows if stopping and stopping.metric == self.objective.metric else None
        problem = unmeasured(config, self.objective.metric, rows)
        if problem is not None:
            where = f"with {varied} {params[varied]!r}, " if varied is not None else ""
            raise ValueError(f"objective.metric: {where}{problem[1]}")

    def dimensions(self) -> dict[str, Dimension]:
        return {name: parse_dimension(name, spec) for name, spec in self.space.items()}

    def first_point(self) -> dict[str, Any]:
        return {name: d.values[0] if isinstance(d, Values) else d.low for name, d in self.dimensions().items()}

    def points(self) -> list[tuple[str | None, dict[str, Any]]]:
        """Points that hold every value of the space at least once, each with the dimension it varies: the first
        point (None), then one dimension at a time at each of its other values (a range: its highest), the
        others at their first. What a sweep is checked on (as a job; through the API, its paths confined)."""
        first = self.first_point()
        out: list[tuple[str | None, dict[str, Any]]] = [(None, first)]
        for name, dim in self.dimensions().items():
            if isinstance(dim, Values):
                others = dim.values[1:]
            elif isinstance(dim, IntRange):
                others = [dim.low + (dim.high - dim.low) // dim.step * dim.step]  # the highest Optuna draws
            else:
                others = [dim.high]
            out += [(name, {**first, name: value}) for value in others]
        return out

    def confine(self, roots: Roots) -> None:
        """PathRefused unless the paths of the base and of every value of the space lie inside `roots`
        (`paths.confine` on each of `points`); a swept field's refusal names it space.<field> and the value."""
        for _, params in self.points():
            try:
                paths.confine(self.trial_config(params), roots)
            except paths.PathRefused as exc:
                if exc.field not in params:
                    raise
                raise paths.PathRefused(f"space.{exc.field}", f"the value {params[exc.field]!r}: {exc.message}",
                                        code=exc.code) from None

    def grid_size(self) -> int:
        return math.prod(len(d.values) for d in self.dimensions().values() if isinstance(d, Values))

    @property
    def budget(self) -> int:
        """Trials to run: n_trials, or fewer when a grid has fewer points."""
        return min(self.n_trials, self.grid_size()) if self.sampler == "grid" else self.n_trials

    def trial_config(self, params: dict[str, Any], number: int | None = None) -> JobConfig:
        """A trial's job: the base with the params and the secrets; a base output_dir gets one folder per trial.
        SecretsNeeded when a secret the trials need is not held: never a trial without it."""
        if self.missing_secrets:
            raise SecretsNeeded(self.missing_secrets)
        fields = {**self.base, **params, **self._secrets}
        if number is not None and fields.get("output_dir"):
            fields["output_dir"] = f"{str(fields['output_dir']).rstrip('/')}/trial-{number}"
        return JobConfig.model_validate(fields)
