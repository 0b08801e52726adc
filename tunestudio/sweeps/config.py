"""A sweep: a base JobConfig, a search space over its fields, a sampler, an objective, a pruner and a budget.

The same shape is the sweep file (`tunestudio sweep SWEEP.yaml`) and the body of `POST /api/sweeps`. Pure data,
validated once: the space parsed into typed dimensions (`space.py`: a range only on a number field, a float range
not on an integer one), its points computed and each made into a job (`points`: the base with each value in turn;
kept, so `confine` and the CLI read them without validating again), and the objective checked against what those
jobs measure (`config.unmeasured`, early stopping's rules).

Secrets (`hf_token`, `wandb_token`) are taken out of `base` as it is validated and kept in memory only: no dump
of a SweepConfig (the study's file, a response) holds them; `trial_config` hands them to each trial, whose job
gives them to its worker through the secrets channel. A space may not vary one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Literal

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
from pydantic_core import to_jsonable_python

from tunestudio import paths
from tunestudio.config import SECRET_FIELDS, JobConfig, field_errors, summary
from tunestudio.config.job import unmeasured
from tunestudio.config.reporting import watchable_metric
from tunestudio.paths import Roots
from tunestudio.sweeps.errors import SecretsNeeded
from tunestudio.sweeps.space import (
    MAX_VALUES,
    Dimension,
    FloatRange,
    IntRange,
    Param,
    Point,
    Values,
    highest,
    parse_dimension,
)

__all__ = ["Dimension", "FloatRange", "IntRange", "Objective", "Point", "SweepConfig", "Values"]


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
    space: dict[str, Dimension] = Field(min_length=1, max_length=50,
                                        description="Per JobConfig field: {values}, {low, high, log} (a float) or "
                                                    "{low, high, step} (an integer).")
    sampler: Literal["grid", "random", "tpe"] = "tpe"
    n_trials: int = Field(default=10, ge=1, le=10_000)
    objective: Objective = Field(default_factory=Objective)
    pruner: Literal["none", "median", "best", "halving"] = "none"
    parallel: int | None = Field(default=None, ge=1, le=64, description="Trials at once; None: the queue's slots.")
    seed: int | None = Field(default=None, description="The sampler's seed.")
    # The base's secrets, by field: in memory only (a private attribute is in no dump; a copy keeps it).
    # _needed: the secret fields the trials need (a restarted server's study names them; `give_secrets` again).
    _secrets: dict[str, SecretStr] = PrivateAttr(default_factory=dict)
    _needed: frozenset[str] = PrivateAttr(default=frozenset())
    _points: tuple[Point, ...] = PrivateAttr(default=())

    @model_validator(mode="before")
    @classmethod
    def _typed_space(cls, data: Any) -> Any:
        """Each dimension parsed once, by its field's type (which a plain union of shapes cannot see); an error
        names space.<field> (a whole-model error names its field first, so a 422 names the field itself)."""
        space = data.get("space") if isinstance(data, dict) else None
        if isinstance(space, dict) and 0 < len(space) <= 50:  # else the field's own bounds answer
            data = {**data, "space": {name: parse_dimension(str(name), spec) for name, spec in space.items()}}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> SweepConfig:
        self._take_secrets()
        swept = set(self.space) & set(self.base)
        if swept:
            raise ValueError(f"base: {', '.join(sorted(swept))} also in the space; set it in one place")
        if self.sampler == "grid":
            ranges = [n for n, d in self.space.items() if not isinstance(d, Values)]
            if ranges:
                raise ValueError(f"space.{ranges[0]}: the grid sampler needs {{values: [...]}}")
        if self.pruner == "best" and self.objective.direction != "minimize":
            # its margins are relative to the best value: measured on losses; a score near 0 early (exact_match at
            # its first evaluations) would stop trials on noise
            raise ValueError(f"pruner: best is for a loss to minimise (it was measured on eval_loss); the objective "
                             f"{self.objective.metric} is maximised: use median")
        values = sum(len(d.values) for d in self.space.values() if isinstance(d, Values))
        if values > MAX_VALUES:
            raise ValueError(f"space: {values} values in all; at most {MAX_VALUES}")
        self._points = tuple(self._point(varied, params) for varied, params in self._spread())
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

    def _point(self, varied: str | None, params: dict[str, Param]) -> Point:
        """One point as a job, and the objective measured by it; an error names the swept field at fault."""
        try:
            job = self.trial_config(params)
        except ValidationError as exc:
            errors = field_errors(exc.errors())
            # the first point passed, so a later point's fault is the value it varies
            at_fault = varied or next((e["field"].split(".")[0] for e in errors if e["field"].split(".")[0] in params),
                                      None)
            if at_fault is None:
                raise ValueError(f"base: {summary(errors)}") from None
            raise ValueError(f"space.{at_fault}: the value {params[at_fault]!r} makes an invalid job: "
                             f"{summary(errors)}") from None
        stopping = job.early_stopping
        rows = job.early_stopping_rows if stopping and stopping.metric == self.objective.metric else None
        problem = unmeasured(job, self.objective.metric, rows)
        if problem is not None:
            where = f"with {varied} {params[varied]!r}, " if varied is not None else ""
            raise ValueError(f"objective.metric: {where}{problem[1]}")
        return Point(varied, params, job)

    def _spread(self) -> list[tuple[str | None, dict[str, Param]]]:
        """Points that hold every value of the space at least once, each with the dimension it varies: the first
        point (None), then one dimension at a time at each of its other values (a range: its highest), the
        others at their first."""
        first: dict[str, Param] = {name: d.values[0] if isinstance(d, Values) else d.low
                                   for name, d in self.space.items()}
        out: list[tuple[str | None, dict[str, Param]]] = [(None, first)]
        for name, dim in self.space.items():
            others: list[Param] = (dim.values[1:] if isinstance(dim, Values)
                                   else [highest(dim)] if isinstance(dim, IntRange) else [dim.high])
            out += [(name, {**first, name: value}) for value in others]
        return out

    @property
    def points(self) -> tuple[Point, ...]:
        """The points a sweep is checked on, with their jobs (computed and validated once, with the sweep)."""
        return self._points

    def first_point(self) -> dict[str, Param]:
        return dict(self._points[0].params)

    def with_base(self, update: dict[str, Any]) -> SweepConfig:
        """The sweep with these base fields set to values its jobs hold already in another spelling (the CLI's
        paths made absolute, typed as a job holds them): each point's job takes them as they are and the base
        their JSON, nothing is validated again."""
        copy = self.model_copy(update={"base": {**self.base, **to_jsonable_python(update)}})
        copy._points = tuple(Point(p.varied, p.params, p.job.model_copy(update=update)) for p in self._points)
        return copy

    def confine(self, roots: Roots) -> None:
        """PathRefused unless the paths of the base and of every value of the space lie inside `roots`
        (`paths.confine` on each point's job); a swept field's refusal names it space.<field> and the value."""
        for point in self._points:
            try:
                paths.confine(point.job, roots)
            except paths.PathRefused as exc:
                if exc.field not in point.params:
                    raise
                raise paths.PathRefused(f"space.{exc.field}", f"the value {point.params[exc.field]!r}: "
                                        f"{exc.message}", code=exc.code) from None

    def grid(self) -> dict[str, list[Param]]:
        """The grid sampler's search space: every {values} dimension."""
        return {name: list(d.values) for name, d in self.space.items() if isinstance(d, Values)}

    @property
    def budget(self) -> int:
        """Trials to run: n_trials, or fewer when a grid has fewer points."""
        size = math.prod(len(values) for values in self.grid().values())
        return min(self.n_trials, size) if self.sampler == "grid" else self.n_trials

    def trial_config(self, params: dict[str, Param], number: int | None = None) -> JobConfig:
        """A trial's job: the base with the params and the secrets; a base output_dir gets one folder per trial.
        SecretsNeeded when a secret the trials need is not held: never a trial without it."""
        if self.missing_secrets:
            raise SecretsNeeded(self.missing_secrets)
        fields = {**self.base, **params, **self._secrets}
        if number is not None and fields.get("output_dir"):
            fields["output_dir"] = f"{str(fields['output_dir']).rstrip('/')}/trial-{number}"
        return JobConfig.model_validate(fields)
