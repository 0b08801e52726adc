"""A sweep's life: an Optuna study (ask/tell) whose trials run as ordinary train jobs of the queue.

The study lives in the data directory (`sweeps/<id>.db`, Optuna's RDB storage on SQLite) with the sweep's
config and status as its user attributes, so a restarted server continues a sweep: its trials still running
(in Optuna's sense) are matched to their jobs by the jobs' tag (`Job.sweep_id`, `Job.trial`).

One `SweepRunner` thread per live sweep, in the server's (or the CLI's) process: it asks Optuna for a trial's
params, submits the trial's JobConfig through `JobManager.submit`, reports the job's evaluations as the
trial's intermediate values, stops a trial the pruner gives up on (with a save) and tells Optuna the
objective when the job ends. Only the manager's public face is used.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

import optuna
from optuna.trial import TrialState

from tunestudio import paths
from tunestudio.jobs.manager import Job, JobConflict, JobManager, JobNotFound, QueueFull
from tunestudio.sweeps import tracking
from tunestudio.sweeps.config import SweepConfig
from tunestudio.sweeps.errors import LIVE, SecretsNeeded
from tunestudio.sweeps.space import IntRange, Param, Values
from tunestudio.sweeps.study import Study, judged
from tunestudio.sweeps.views import BeforeAfter, BestTrial, ObjectiveView, SweepView, TrialRow

log = logging.getLogger(__name__)

# A trial's user attribute: the step of the evaluation the pruner gave up on it at. The verdict is told Optuna when
# the job it stopped has ended (a restarted server reads it here): a job past its last step when the stop came
# completes anyway, and is then the completed trial it is, its value counted.
PRUNED_AT = "pruned_at"
# The shortest time between two looks of a runner woken by its jobs' writes (an evaluation and a status change may
# commit apart; each look reads the study and the sweep's jobs).
MIN_POLL_S = 0.05


def _suggest(trial: optuna.Trial, config: SweepConfig) -> dict[str, Param]:
    params: dict[str, Param] = {}
    for name, dim in config.space.items():
        if isinstance(dim, Values):
            params[name] = trial.suggest_categorical(name, dim.values)
        elif isinstance(dim, IntRange):
            params[name] = trial.suggest_int(name, dim.low, dim.high, step=dim.step)
        else:
            params[name] = trial.suggest_float(name, dim.low, dim.high, log=dim.log)
    return params


def record_value(record: dict[str, Any], key: str) -> float | None:
    """The objective's value in one metric record: eval_loss is a column, the others are in `extra`."""
    value = record.get(key) if key == "eval_loss" else (record.get("extra") or {}).get(key)
    return float(value) if isinstance(value, (int, float)) else None


def final_value(job: Job, config: SweepConfig) -> tuple[float | None, int | None]:
    """A finished job's objective and the step of the weights it measures (the trial's best_step): the job's
    best and its step (early stopping on the same metric), else the final evaluation's value after training,
    else its final metrics: both measure the artefacts, the last step's weights, or with keep_best (early
    stopping on another metric) the best step's."""
    objective = config.objective
    result = job.result or {}
    best = result.get("best") or {}
    if best.get("metric") in (objective.metric, objective.record_key):
        return float(best["value"]), best.get("step")
    weights = best.get("step") if best.get("checkpoint") else (job.progress or {}).get("step")
    after = ((result.get("evaluation") or {}).get("metrics") or {}).get(objective.metric) or {}
    if isinstance(after.get("after"), (int, float)):
        return float(after["after"]), weights
    for key in (objective.record_key, objective.metric):
        value = (job.final_metrics or {}).get(key)
        if isinstance(value, (int, float)):
            return float(value), weights
    return None, None


class SweepRunner(threading.Thread):
    """Runs one sweep until its budget is spent or it is stopped; `halt()` leaves it to a later runner."""

    def __init__(self, manager: JobManager, study: Study, poll_seconds: float = 0.5) -> None:
        super().__init__(name=f"sweep-{study.id}", daemon=True)
        self.manager = manager
        self.study = study
        self.config = study.config
        self.poll_seconds = poll_seconds
        self.parallel = self.config.parallel or manager.settings.max_concurrent_jobs
        self._halt = threading.Event()
        # Set when this process commits a new status or an evaluation of one of the sweep's live jobs (Store's
        # listeners): the runner looks at once instead of at its next poll; the poll stays for jobs another process
        # runs.
        self._poke = threading.Event()
        self._watched: frozenset[str] = frozenset()  # the live trials' job ids (replaced whole, read by the writer)
        self._trials: dict[int, optuna.Trial] = {}  # the live trials' handles, by number
        self._sent_stop: set[int] = set()
        self._tracking: dict[str, str] = {}  # report_to mlflow: the fields each trial's config gets

    def halt(self) -> None:
        """Stop this thread (not the sweep's jobs): a later runner on the same study continues the sweep."""
        self._halt.set()
        self._poke.set()

    def _committed(self, job_ids: frozenset[str]) -> None:
        if job_ids & self._watched:
            self._poke.set()

    def run(self) -> None:
        self._tracking = self._open_tracking()
        stop_listening = self.manager.on_commit(self._committed)
        try:
            while not self._halt.is_set():
                self._poke.clear()
                try:
                    if self.step():
                        return
                except Exception:  # a runner outlives any one bad poll (the store busy, a job deleted under it)
                    log.exception("sweep %s: poll failed", self.study.id)
                if self._poke.wait(self.poll_seconds):
                    self._halt.wait(MIN_POLL_S)  # a job's writes come in bursts: one look for each
        finally:
            stop_listening()

    def step(self) -> bool:
        """One poll: follow the live trials, start new ones; True when the sweep is over."""
        study = self.study.study
        status = self.study.status
        trials = study.get_trials(deepcopy=False)
        jobs = self._jobs_by_trial()
        self._watched = frozenset(job.id for job in jobs.values() if job.status.is_live)
        live = [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
        for frozen in live:
            if self._halt.is_set():
                return False
            self._follow(frozen, jobs.get(frozen.number), status)
        live = [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))]
        # A trial is told when its job has ended (a pruned one's too), but a job that ended after this poll's
        # listing counts as live until the next poll (one listing a poll: each Job is its config validated from
        # its row), and the sweep ends after it.
        ending = any(job.status.is_live for job in jobs.values())
        if status == "running":
            started = len(study.get_trials(deepcopy=False))
            # Without its secrets (a restarted server's sweep) it starts nothing: it waits for `Sweeps.resume`.
            waiting = bool(self.config.missing_secrets)
            while (started < self.config.budget and len(live) < self.parallel and not waiting
                   and not self._halt.is_set()):
                trial = study.ask()
                self._trials[trial.number] = trial
                self._submit(trial.number, _suggest(trial, self.config))
                live.append(trial)
                started += 1
            if started >= self.config.budget and not live and not ending:
                self._end("completed")
                return True
        elif not live and not ending:
            self._end("stopped")
            return True
        return False

    def _end(self, status: str) -> None:
        """The sweep's end: its MLflow run closed first, so a sweep that says it ended has its run ended."""
        run_id = self._tracking.get("mlflow_parent_run_id")
        if run_id:
            uri, experiment = tracking.store(self.config, self.manager.settings.mlflow_tracking_uri())
            tracking.close_parent(run_id, uri, experiment,
                                  view(self.study, self._jobs_by_trial()).model_copy(update={"status": status}))
        self.study.set_status(status)

    def _open_tracking(self) -> dict[str, str]:
        """report_to mlflow: the sweep's parent run (opened once, kept in the study), as the trials' fields."""
        if not tracking.wanted(self.config):
            return {}
        uri, experiment = tracking.store(self.config, self.manager.settings.mlflow_tracking_uri())
        attrs = self.study.study.user_attrs
        run_id = attrs.get("mlflow_run_id")
        if run_id is None and self.study.status == "running":
            answer = tracking.open_parent(self.study.id, self.config, uri, experiment)
            if "error" in answer:  # the trials still report to mlflow, and say what is wrong in their own runs
                log.warning("sweep %s: no MLflow parent run: %s", self.study.id, answer["error"])
                self.study.study.set_user_attr("mlflow_error", answer["error"])
                return {"mlflow_tracking_uri": uri}
            run_id = answer["run_id"]
            self.study.study.set_user_attr("mlflow_run_id", run_id)
        return {"mlflow_tracking_uri": uri, **({"mlflow_parent_run_id": run_id} if run_id else {})}

    def _jobs_by_trial(self) -> dict[int, Job]:
        return jobs_by_trial(self.manager, self.study.id)

    def _handle(self, number: int) -> optuna.Trial:
        if number not in self._trials:  # a trial an earlier runner asked for
            frozen = self.study.study.get_trials(deepcopy=False)[number]
            self._trials[number] = optuna.trial.Trial(self.study.study, frozen._trial_id)
        return self._trials[number]

    def _submit(self, number: int, params: dict[str, Any]) -> None:
        if self.config.missing_secrets:
            return  # the trial stays running; it is submitted once the sweep is given its secrets again
        try:
            config = self.config.trial_config(params, number)
            if self.study.confined:  # the API checked each value alone; a combination is checked here
                paths.confine(config, self.manager.settings.roots())
            if self._tracking:  # the trial's MLflow run: a child of the sweep's
                config = config.model_copy(update={**self._tracking,
                                                   "mlflow_run_name": f"{self.study.id} trial {number}"})
            job = self.manager.submit(config, sweep=(self.study.id, number))
        except QueueFull:
            return  # the trial stays running; the next poll tries again
        except Exception as exc:  # an invalid config or a refused path: the trial fails, the sweep goes on
            log.warning("sweep %s: trial %d not submitted: %s", self.study.id, number, exc)
            self._tell(number, TrialState.FAIL, error=str(exc))
            return
        self._handle(number).set_user_attr("job_id", job.id)
        self._watched = self._watched | {job.id}

    def _follow(self, frozen: optuna.trial.FrozenTrial, job: Job | None, status: str) -> None:
        number = frozen.number
        if job is None:  # asked, never submitted (a crash in between, or the queue was full)
            if status == "running":
                self._submit(number, frozen.params)
            else:
                self._tell(number, TrialState.FAIL, error="the sweep stopped before the trial started")
            return
        if job.status.is_live:
            self._report(frozen, job)
            if status == "stopping" and number not in self._sent_stop:
                self._sent_stop.add(number)
                with contextlib.suppress(JobConflict, JobNotFound):
                    self.manager.stop(job.id, save=True)
            return
        if PRUNED_AT in frozen.user_attrs and job.status.value != "completed":
            # the pruner's verdict, now that the job it stopped has ended (not run again, whatever stopped it)
            self._tell(number, TrialState.PRUNED, best_step=self._best_step(frozen.intermediate_values))
            return
        value, best_step = final_value(job, self.config) if job.status.value == "completed" else (None, None)
        if value is None and job.status.value != "failed":
            value, best_step = self._last_value(job)
        if job.status.value == "completed" and value is not None:
            self._tell(number, TrialState.COMPLETE, value, best_step=best_step)
        elif job.status.value in ("stopped", "interrupted", "cancelled") and status == "running":
            # Ended by something other than this sweep (a server shutting down, a crash): run the trial again.
            self._submit(number, frozen.params)
        elif job.status.value == "stopped" and value is not None:
            self._tell(number, TrialState.COMPLETE, value, best_step=best_step)
        else:
            self._tell(number, TrialState.FAIL, error=job.error or f"job {job.id} ended {job.status.value}")

    def _report(self, frozen: optuna.trial.FrozenTrial, job: Job) -> None:
        """The job's new evaluations as the trial's intermediate values; a trial the pruner gives up on stops (the
        verdict is told when its job has ended: `_follow`)."""
        if PRUNED_AT in frozen.user_attrs:
            return  # judged: its job is stopping, and the trial keeps the values it was judged on
        seen = frozen.intermediate_values
        since = max(seen) if seen else None
        trial = self._handle(frozen.number)
        steps, total = dict(seen), None
        for record in self.manager.metrics(job.id, since_step=since):
            value = record_value(record, self.config.objective.record_key)
            total = record.get("total_steps") or total
            if value is not None and record["step"] not in steps:
                trial.report(value, record["step"])
                steps[record["step"]] = value
        warm = bool(steps) and judged(self.config.pruner, len(steps), max(steps), total)
        if len(steps) > len(seen) and warm and job.status.value != "stopping" and trial.should_prune():
            log.info("sweep %s: trial %d pruned at step %d", self.study.id, frozen.number, max(steps))
            trial.set_user_attr(PRUNED_AT, max(steps))
            with contextlib.suppress(JobConflict, JobNotFound):
                self.manager.stop(job.id, save=True)

    def _last_value(self, job: Job) -> tuple[float | None, int | None]:
        """The job's last evaluation of the objective, and its step (the value told is that step's)."""
        values = {r["step"]: v for r in self.manager.metrics(job.id)
                  if (v := record_value(r, self.config.objective.record_key)) is not None}
        return (values[max(values)], max(values)) if values else (None, None)

    def _best_step(self, values: dict[int, float]) -> int | None:
        if not values:
            return None
        pick = min if self.config.objective.direction == "minimize" else max
        return pick(values, key=lambda step: values[step])

    def _tell(self, number: int, state: TrialState, value: float | None = None, *, best_step: int | None = None,
              error: str | None = None) -> None:
        trial = self._handle(number)
        if best_step is not None:
            trial.set_user_attr("best_step", best_step)
        if error is not None:
            trial.set_user_attr("error", error[:2000])
        self.study.study.tell(number, value if state is TrialState.COMPLETE else None, state=state,
                              skip_if_finished=True)
        self._trials.pop(number, None)


def jobs_by_trial(manager: JobManager, sweep_id: str) -> dict[int, Job]:
    """The newest job of each trial of the sweep, found by its tag (the manager lists newest first)."""
    found: dict[int, Job] = {}
    for job in manager.list(sweep_id=sweep_id, limit=100_000):
        if job.trial is not None and job.trial not in found:
            found[job.trial] = job
    return found


def _trial_row(frozen: optuna.trial.FrozenTrial, job: Job | None) -> TrialRow:
    """One trial's row: Optuna's verdict (or its job's status while it runs), its value and its job's figures: the
    steps it ran, its evaluation before and after training ({metric: {before, after}}, as the job's result has it)."""
    state = {TrialState.COMPLETE: "completed", TrialState.PRUNED: "pruned", TrialState.FAIL: "failed"}.get(
        frozen.state) or (job.status.value if job is not None else "asked")
    value = frozen.value
    if value is None and frozen.intermediate_values:
        value = frozen.intermediate_values[max(frozen.intermediate_values)]
    metrics = ((job.result or {}).get("evaluation") or {}).get("metrics") if job is not None else None
    return TrialRow(number=frozen.number, job_id=job.id if job else frozen.user_attrs.get("job_id"),
                    params=frozen.params, status=state, value=value, best_step=frozen.user_attrs.get("best_step"),
                    pruned_at=frozen.user_attrs.get(PRUNED_AT) if state == "pruned" else None,
                    error=frozen.user_attrs.get("error"),
                    steps=(job.progress or {}).get("step") if job is not None else None,
                    job_status=job.status.value if job is not None else None,
                    evaluation={name: BeforeAfter(before=m.get("before"), after=m.get("after"))
                                for name, m in metrics.items() if isinstance(m, dict)} if metrics else None)


def view(study: Study, jobs: dict[int, Job]) -> SweepView:
    """The sweep as the API, the CLI and the page show it: trials ranked by the objective, and the best."""
    config = study.config
    minimize = config.objective.direction == "minimize"
    order = {"completed": 0, "pruned": 1}

    def rank(t: TrialRow) -> tuple[int, float, int]:
        if t.value is None:
            return (3, 0.0, t.number)
        return (order.get(t.status, 2), t.value if minimize else -t.value, t.number)

    trials = sorted((_trial_row(frozen, jobs.get(frozen.number)) for frozen in study.study.get_trials(deepcopy=False)),
                    key=rank)
    top = next((t for t in trials if t.status == "completed" and t.value is not None), None)
    attrs = study.study.user_attrs
    status, missing = attrs.get("status", "running"), config.missing_secrets
    needs = bool(missing) and status in LIVE
    return SweepView(
        id=study.id, status="needs_secrets" if needs and status == "running" else status,
        secrets=config.secret_fields, secrets_missing=missing,
        error=str(SecretsNeeded(missing, study.id)) if needs else None, created_at=attrs.get("created_at"),
        objective=ObjectiveView(metric=config.objective.metric, mode="min" if minimize else "max"),
        sampler=config.sampler, pruner=config.pruner, n_trials=config.budget, parallel=config.parallel,
        config=config.model_dump(mode="json"), mlflow_run_id=attrs.get("mlflow_run_id"),
        mlflow_error=attrs.get("mlflow_error"), trials=trials,
        best=BestTrial(number=top.number, job_id=top.job_id, value=top.value, params=top.params)
        if top is not None and top.value is not None else None)
