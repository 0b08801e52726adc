"""What a sweep looks like from outside: the leaderboard the API answers, the CLI draws and the page reads.

Pure models (no Optuna: the faces import them at start); `runner.view` fills one from a study and its jobs.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from tunestudio.sweeps.space import Param

__all__ = ["BeforeAfter", "BestTrial", "ObjectiveView", "SweepList", "SweepStatus", "SweepView", "TrialRow"]

# running and stopping are live; needs_secrets: live, but a restarted server's sweep waits for its secrets
SweepStatus = Literal["running", "stopping", "completed", "stopped", "needs_secrets"]


class BeforeAfter(BaseModel):
    """One metric of a trial's job measured on the base model (before) and on the trained one (after)."""

    before: float | None = None
    after: float | None = None


class TrialRow(BaseModel):
    number: int
    job_id: str | None = Field(description="The trial's job (its newest, when it ran again).")
    params: dict[str, Param] = Field(description="The values Optuna drew for the swept fields.")
    status: str = Field(description="completed, pruned or failed; while it runs, its job's status; asked: not "
                                    "submitted yet.")
    value: float | None = Field(description="The objective: told, or (pruned, running) the last evaluation's; a "
                                            "pruned trial's is the evaluation the pruner gave up on it at.")
    best_step: int | None = Field(description="The step of the weights the value measures.")
    pruned_at: int | None = Field(default=None, description="A pruned trial: the step of the evaluation the pruner "
                                                            "gave up on it at (its job stopped a little after).")
    error: str | None = None
    steps: int | None = Field(default=None, description="The steps its job trained.")
    job_status: str | None = None
    evaluation: dict[str, BeforeAfter] | None = Field(default=None, description="Per metric, from the job's result.")


class BestTrial(BaseModel):
    number: int
    job_id: str | None
    value: float
    params: dict[str, Param]


class ObjectiveView(BaseModel):
    metric: str
    mode: Literal["min", "max"]


class SweepView(BaseModel):
    """A sweep: its settings, its trials ranked by the objective (completed by value, then pruned by their last
    value, then the rest) and the best. No secret: `secrets` names those the sweep holds in memory."""

    id: str
    status: SweepStatus
    secrets: list[str] = Field(description="The secret fields its base set (names only; never their values).")
    secrets_missing: list[str] = Field(description="Those a restarted server has lost: POST .../resume gives them.")
    error: str | None = Field(description="Why a live sweep makes no trial (its secrets are needed again).")
    created_at: float | None
    objective: ObjectiveView
    sampler: str
    pruner: str
    n_trials: int = Field(description="Its budget: n_trials, or the grid's size when that is smaller.")
    parallel: int | None
    config: dict[str, Any] = Field(description="The sweep as created (its file's shape), without secrets.")
    mlflow_run_id: str | None
    mlflow_error: str | None
    trials: list[TrialRow]
    best: BestTrial | None


class SweepList(BaseModel):
    items: list[SweepView]
