"""One sweep's Optuna study in its own SQLite file (`TUNESTUDIO_HOME/sweeps/<id>.db`), its sampler and pruner.

The sweep's config (no secrets: `SweepConfig` keeps them in memory; their names are kept, `secret_fields`), its
status and creation time are the study's user attributes, so a restarted server reads the sweep back.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from tunestudio.config import SECRET_FIELDS
from tunestudio.settings import private_file
from tunestudio.sweeps.config import SweepConfig
from tunestudio.sweeps.errors import SweepNotFound

optuna.logging.set_verbosity(optuna.logging.WARNING)


class _GridSampler(optuna.samplers.GridSampler):
    """Optuna's grid without its `study.stop()` once every point is taken: that works inside `optimize` only
    (ask/tell raises); the sweep's budget (n_trials, at most the grid's size) ends it instead."""

    def after_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, state: TrialState,
                    values: Any) -> None:
        return None


def _sampler(config: SweepConfig) -> optuna.samplers.BaseSampler:
    if config.sampler == "grid":
        return _GridSampler(config.grid(), seed=config.seed)
    if config.sampler == "random":
        return optuna.samplers.RandomSampler(seed=config.seed)
    return optuna.samplers.TPESampler(seed=config.seed, n_startup_trials=min(10, max(2, config.budget // 3)))


# The median pruner judges a trial from its second evaluation on, and once it has trained a third of its steps
# (the job's records say its total; n_warmup_steps would need it before the job starts). Measured on the sweep
# bench's space (bench/pruner_replay.py over the full grids of 6 seeds, tests/sweeps/data/full_grids.json): judged
# at a quarter of the steps, the median pruner gave up on the eventual winner in 1 of 6 seeds (its loss rose
# between its first and second evaluations, as a high learning rate's does); from a third on it kept it in 6 of 6,
# and in the 6 held-out grids recorded after (seeds 6-11, full_grids_heldout.json). Rules that prune more and keep
# the winner in all 12 (bench/pruner_replay.py's table) train about half the grid's steps where this one trains two
# thirds: too little to bring a sweep to half the grid's wall time (a trial's start and save, which no pruning saves,
# and the first trials, which run whole), and the percentile and halving ones sit beside a setting that loses it.
MEDIAN_WARMUP_EVALUATIONS = 2
MEDIAN_WARMUP_FRACTION = 1 / 3


def judged(pruner: str, evaluations: int, step: int, total_steps: int | None) -> bool:
    """Whether the pruner may judge a trial at this evaluation (`evaluations` of them so far, `step` of its
    `total_steps`, None or 0 when its job does not know it yet)."""
    if pruner != "median":
        return True
    # (a job's records always carry its total; without one, the evaluations alone decide)
    trained_enough = not total_steps or step >= MEDIAN_WARMUP_FRACTION * total_steps - 1e-9
    return evaluations >= MEDIAN_WARMUP_EVALUATIONS and trained_enough


# The "best" pruner: a trial stops when it is more than a margin behind the best value any other trial had at the
# same evaluation; the margin is relative to that best value, wide at the trial's first training evaluation (a slow
# start is normal: only the hopeless stop, such as a learning rate too small to move), narrow after it. Chosen on the
# recorded grids of seeds 0-11 (bench/pruner_replay.py) and checked on seeds 12-17, recorded after the choice
# (full_grids_heldout2.json): the winner kept in all 18, about 0.4 of the grid's steps trained.
BEST_FIRST_MARGIN = 0.5
BEST_MARGIN = 0.1


class BestPruner(optuna.pruners.BasePruner):
    """Stops a trial more than a margin behind the best other trial at the same step (`BEST_FIRST_MARGIN` at its
    first evaluation after step 0, `BEST_MARGIN` after; the base's evaluation at step 0 is never judged)."""

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        step = trial.last_step
        if not step:
            return False
        value = trial.intermediate_values[step]
        if math.isnan(value):
            return True  # diverged
        others = [v for t in study.get_trials(deepcopy=False)
                  if t.number != trial.number and not math.isnan(v := t.intermediate_values.get(step, math.nan))]
        if not others:
            return False
        first = sum(1 for s in trial.intermediate_values if s > 0) == 1
        margin = BEST_FIRST_MARGIN if first else BEST_MARGIN
        if study.direction == optuna.study.StudyDirection.MINIMIZE:
            best = min(others)
            return value > best + margin * abs(best)
        best = max(others)
        return value < best - margin * abs(best)


def _pruner(config: SweepConfig) -> optuna.pruners.BasePruner:
    if config.pruner == "best":
        return BestPruner()
    if config.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0)
    if config.pruner == "halving":
        return optuna.pruners.SuccessiveHalvingPruner()
    return optuna.pruners.NopPruner()


def replay(config: SweepConfig, curves: list[list[tuple[int, float]]], total_steps: int | None) -> list[int | None]:
    """What the sweep's pruner does to recorded trials run one after another (parallel 1), with the runner's warm-up
    (`judged`): per trial, the step it is stopped at, or None when it completes. Each curve is a trial's evaluations
    of the objective, (step, value) in order; a completed trial's value is its last (its job's final evaluation).
    The runner asks at its polls, so a trial may be judged a little later there, and a trial early stopping ended
    is told its best."""
    return replay_with(_pruner(config), config.objective.direction, curves,
                       lambda count, step: judged(config.pruner, count, step, total_steps))


def replay_with(pruner: optuna.pruners.BasePruner, direction: str, curves: list[list[tuple[int, float]]],
                judge: Callable[[int, int], bool]) -> list[int | None]:
    """`replay`'s loop for any pruner: a trial is asked at its evaluation (count, step) when `judge` says so
    (bench/pruner_replay.py replays rules that are not the sweep's through it)."""
    study = optuna.create_study(direction=direction, pruner=pruner)
    stops: list[int | None] = []
    for curve in curves:
        trial, stopped = study.ask(), None
        for count, (step, value) in enumerate(curve, 1):
            trial.report(value, step)
            if judge(count, step) and trial.should_prune():
                stopped = step
                break
        study.tell(trial, curve[-1][1] if stopped is None else None,
                   state=TrialState.COMPLETE if stopped is None else TrialState.PRUNED)
        stops.append(stopped)
    return stops


class Study:
    """One sweep's Optuna study in its own SQLite file."""

    def __init__(self, path: Path, config: SweepConfig | None = None, confined: bool = False) -> None:
        self.id = path.stem
        self.path = path
        create = config is not None
        if not create and not path.is_file():
            raise SweepNotFound(self.id)
        private_file(path)  # the study: the sweep's config, its trials and their values are the owner's only
        self.storage = optuna.storages.RDBStorage(f"sqlite:///{path}")
        if create:
            assert config is not None
            self.study = optuna.create_study(storage=self.storage, study_name=self.id,
                                             direction=config.objective.direction,
                                             sampler=_sampler(config), pruner=_pruner(config))
            # The config's dump holds no secret (SweepConfig keeps them in memory); their names are kept, so a
            # restarted server knows the sweep needs them given again.
            self.study.set_user_attr("config", config.model_dump(mode="json"))
            self.study.set_user_attr("secret_fields", config.secret_fields)
            self.study.set_user_attr("created_at", time.time())
            self.study.set_user_attr("status", "running")
            self.study.set_user_attr("confined", confined)
            self.config = config
        else:
            attrs = optuna.load_study(study_name=self.id, storage=self.storage).user_attrs
            self.config = SweepConfig.model_validate(attrs["config"])
            self.config.expect_secrets(attrs.get("secret_fields") or [])
            self.study = optuna.load_study(study_name=self.id, storage=self.storage,
                                           sampler=_sampler(self.config), pruner=_pruner(self.config))
            if set(attrs["config"].get("base") or {}) & set(SECRET_FIELDS):
                self._forget_stored_secrets()

    def _forget_stored_secrets(self) -> None:
        """A study an older version wrote kept the base's secrets: this process holds them now (in memory), the
        file keeps their names only, and VACUUM rewrites it so no freed page still holds their bytes."""
        self.study.set_user_attr("config", self.config.model_dump(mode="json"))
        self.study.set_user_attr("secret_fields", self.config.secret_fields)
        with self.storage.engine.connect() as connection:
            connection.exec_driver_sql("VACUUM")

    @property
    def status(self) -> str:
        return self.study.user_attrs.get("status", "running")

    @property
    def confined(self) -> bool:
        """Created through the API: every trial's paths inside the allowed roots."""
        return bool(self.study.user_attrs.get("confined"))

    def set_status(self, status: str) -> None:
        self.study.set_user_attr("status", status)

    def close(self) -> None:
        self.storage.remove_session()
        self.storage.engine.dispose()


def new_sweep_id() -> str:
    return "sw-" + secrets.token_hex(6)
