"""Sweeps through a real JobManager and its queue, with scripted workers whose objective is a known function."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from tunestudio.config import field_errors
from tunestudio.jobs.manager import Job, JobManager
from tunestudio.jobs.status import JobStatus
from tunestudio.settings import Settings
from tunestudio.sweeps import SecretsNeeded, SweepConfig, Sweeps
from tunestudio.sweeps.runner import Study, SweepRunner, final_value

from ..helpers import fake_workers
from ..helpers.jobs import DATA

LRS, RANKS = [1e-4, 1e-3, 1e-2], [4, 16]


def settings(tmp_path: Path, **overrides: Any) -> Settings:
    return Settings(home=tmp_path / "home", **{"max_concurrent_jobs": 2, "prewarm": False, **overrides})


def sweep(**overrides: Any) -> SweepConfig:
    body: dict[str, Any] = {
        "base": {"model_name": "tiny", "local_datasets": [str(DATA / "alpaca.jsonl")], "max_steps": 10,
                 "eval_steps": 2},
        "space": {"learning_rate": {"values": LRS}, "lora_r": {"values": RANKS}},
        "sampler": "grid", "n_trials": 6, "objective": {"metric": "eval_loss", "mode": "min"}, "parallel": 2,
    }
    body.update(overrides)
    return SweepConfig.model_validate(body)


def final_loss(params: dict[str, Any], steps: int = 10) -> float:
    return fake_workers.sweep_objective(params["learning_rate"], params["lora_r"]) + 1.0 / steps


def wait_status(sweeps: Sweeps, sweep_id: str, wanted: set[str], timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        view = sweeps.get(sweep_id)
        if view.status in wanted:
            return view
        time.sleep(0.1)
    raise AssertionError(f"sweep {sweep_id} still {sweeps.get(sweep_id).status} after {timeout}s")


def test_a_six_trial_grid_sweep_runs_through_the_queue_and_ranks_by_the_objective(tmp_path: Path) -> None:
    with JobManager(settings(tmp_path), worker_target=fake_workers.sweep_trial) as manager, \
            Sweeps(manager, poll_seconds=0.05) as sweeps:
        sweep_id = sweeps.create(sweep()).id
        view = wait_status(sweeps, sweep_id, {"completed"})
        trials = view.trials
        assert len(trials) == 6 and {t.status for t in trials} == {"completed"}
        assert sorted((t.params["learning_rate"], t.params["lora_r"]) for t in trials) == sorted(
            (lr, r) for lr in LRS for r in RANKS)
        for trial in trials:  # each an ordinary job, tagged with the sweep and its number
            job = manager.get(trial.job_id)
            assert (job.status, job.sweep_id, job.trial) == (JobStatus.completed, sweep_id, trial.number)
            assert trial.value == pytest.approx(final_loss(trial.params))
            assert trial.best_step == 10  # no early stopping: the value is the last step's weights'
        values = [t.value for t in trials]
        assert values == sorted(values)
        assert view.best.params == {"learning_rate": 1e-3, "lora_r": 16}
        assert view.best.job_id == trials[0].job_id
        assert {j.id for j in manager.list(sweep_id=sweep_id)} == {t.job_id for t in trials}


def test_the_best_pruner_is_refused_for_a_metric_to_maximise() -> None:
    with pytest.raises(ValidationError, match=r"pruner: best is for a loss to minimise.*exact_match is maximised"):
        sweep(pruner="best", objective={"metric": "exact_match", "mode": "max"})
    assert sweep(pruner="best").pruner == "best"  # eval_loss, minimised


def test_a_bad_space_names_the_field() -> None:
    with pytest.raises(ValidationError, match=r"space\.lora_rank: JobConfig has no field 'lora_rank'"):
        sweep(space={"lora_rank": {"values": [4, 8]}})
    with pytest.raises(ValidationError, match=r"space.learning_rate: .*low \(0.1\) must be below high"):
        sweep(space={"learning_rate": {"low": 0.1, "high": 0.01}}, sampler="random")
    with pytest.raises(ValidationError, match=r"space\.learning_rate: the grid sampler needs"):
        sweep(space={"learning_rate": {"low": 1e-4, "high": 1e-2, "log": True}})
    with pytest.raises(ValidationError, match="lora_r"):
        sweep(space={"lora_r": {"values": [-3]}})  # the base with the space's first point is not a valid job
    # every value is a job, not only the first point's
    with pytest.raises(ValidationError, match=r"space\.lora_r: the value -3 makes an invalid job: lora_r: Input "
                                              "should be greater than or equal to 1"):
        sweep(space={"lora_r": {"values": [4, -3]}})
    with pytest.raises(ValidationError, match=r"space\.learning_rate: the value 2\.0 makes an invalid job"):
        sweep(space={"learning_rate": {"low": 1e-4, "high": 2.0, "log": True}}, sampler="random")
    with pytest.raises(ValidationError, match=r"space\.lora_r: the value 4100 makes an invalid job"):
        sweep(space={"lora_r": {"low": 4, "high": 4103, "step": 8}}, sampler="random")  # 4100: the top drawn
    sweep(space={"lora_r": {"low": 4, "high": 4099, "step": 8}}, sampler="random")  # its top, 4092, is valid
    with pytest.raises(ValidationError, match=r"space\.lora_r: lora_r is an integer; use \{low, high, step\}"):
        sweep(space={"lora_r": {"low": 4, "high": 64, "log": True}}, sampler="random")
    with pytest.raises(ValidationError, match=r"space\.max_steps: max_steps is an integer"):
        sweep(space={"max_steps": {"low": 10.0, "high": 40.0}}, sampler="random", base={**sweep().base,
                                                                                           "max_steps": None})
    with pytest.raises(ValidationError, match=r"space\.model_name: model_name is not a number"):
        sweep(space={"model_name": {"low": 1, "high": 3}}, sampler="random")
    # an integer range on a float field is fine (eval_steps is a float that takes whole steps)
    assert sweep(space={"eval_steps": {"low": 2, "high": 6, "step": 2}}, sampler="random",
                 base={k: v for k, v in sweep().base.items() if k != "eval_steps"}).first_point() == {"eval_steps": 2}


@pytest.mark.parametrize(("overrides", "said"), [
    ({"objective": {"metric": "eval_acuracy"}}, "'eval_acuracy' is not a metric a job's evaluations measure; use "
                                                "one of eval_loss, exact_match"),
    ({"objective": {"metric": "eval_reward"}}, "eval_reward is a metric of method grpo, not of 'sft'"),
    ({"objective": {"metric": "token_f1"}, "base": {"eval_generate_rows": 0}},
     "token_f1 is measured on held-out rows the model answers, and eval_generate_rows is 0"),
    ({"objective": {"metric": "exact_match"}, "base": {"format_type": "text"}},
     "exact_match compares generated answers with the reference replies of held-out rows, and the rows of format "
     "'text' have none"),
    ({"objective": {"metric": "eval_loss"}, "space": {"eval_steps": {"values": [2, 0]}}, "base": {"eval_steps": None}},
     "with eval_steps 0, eval_loss needs evaluations during training"),
])
def test_an_objective_the_trials_do_not_measure_names_objective_metric(overrides: dict[str, Any], said: str) -> None:
    """The objective is checked with early stopping's rules (config.job.unmeasured) against every point's job."""
    base = {k: v for k, v in {**sweep().base, **overrides.pop("base", {})}.items() if v is not None}
    with pytest.raises(ValidationError) as info:
        sweep(base=base, sampler="random", **overrides)
    errors = field_errors(info.value.errors())
    assert [e["field"] for e in errors] == ["objective.metric"], errors
    assert said in errors[0]["message"], errors


def test_a_sweeps_secrets_are_never_dumped_and_never_lost_silently() -> None:
    """What is stored (the config's JSON) holds no secret; a config read back without it refuses to make a trial,
    naming the field, rather than run one with no token or a mask ("**********") of it."""
    config = sweep(base={**sweep().base, "hf_token": "hf_secret", "wandb_token": SecretStr("wb_secret")})
    stored = config.model_dump(mode="json")
    assert "secret" not in json.dumps(stored) and "*****" not in json.dumps(stored)
    assert config.secret_fields == ["hf_token", "wandb_token"] and config.missing_secrets == []
    for copy in (config, config.model_copy(update={"n_trials": 3})):  # a copy keeps them (the CLI's resolve)
        trial = copy.trial_config(copy.first_point(), 0)
        assert (trial.hf_token.get_secret_value(), trial.wandb_token.get_secret_value()) == ("hf_secret", "wb_secret")
    loaded = SweepConfig.model_validate(stored)
    loaded.expect_secrets(config.secret_fields)
    assert loaded.missing_secrets == ["hf_token", "wandb_token"]
    with pytest.raises(SecretsNeeded, match="hf_token, wandb_token") as info:
        loaded.trial_config(loaded.first_point(), 0)
    assert info.value.fields == ["hf_token", "wandb_token"]
    loaded.give_secrets({"hf_token": SecretStr("hf_secret"), "wandb_token": SecretStr("wb_secret")})
    assert loaded.trial_config(loaded.first_point(), 0).hf_token.get_secret_value() == "hf_secret"


def test_a_study_an_older_version_wrote_with_a_secret_keeps_its_name_only(tmp_path: Path) -> None:
    """Before issue 38 a study stored its base as given, secrets and all: read back, the file forgets them (the
    process holds them) and no answer shows them."""
    path = tmp_path / "sw-000000000001.db"
    config = sweep(base={**sweep().base, "hf_token": "hf_stored_by_an_older_version"})
    Study(path, config).close()
    old = Study(path)
    old.study.set_user_attr("config", {**config.model_dump(mode="json"),
                                       "base": {**config.base, "hf_token": "hf_stored_by_an_older_version"}})
    old.study.set_user_attr("secret_fields", None)
    old.close()
    assert b"hf_stored_by_an_older_version" in path.read_bytes()
    study = Study(path)
    assert study.config.trial_config(study.config.first_point()).hf_token.get_secret_value() == (
        "hf_stored_by_an_older_version")
    assert "hf_token" not in study.config.model_dump(mode="json")["base"]
    study.close()
    assert b"hf_stored_by_an_older_version" not in path.read_bytes()
    again = Study(path)  # a later server: it knows the sweep needs the secret, and has it no more
    assert again.config.missing_secrets == ["hf_token"]
    again.close()


def test_a_secret_is_not_a_dimension_of_the_space() -> None:
    with pytest.raises(ValidationError, match=r"space\.hf_token: hf_token is a secret"):
        sweep(space={"hf_token": {"values": ["a", "b"]}})


def test_a_sweep_created_confined_fails_a_trial_whose_paths_leave_the_roots(tmp_path: Path) -> None:
    """The API confines every value (a 422 before anything runs); a confined sweep also confines each trial it
    submits, whatever combination of values it drew: one outside the roots fails and is never a job."""
    inside = tmp_path / "home" / "runs"
    config = sweep(space={"learning_rate": {"values": [1e-3]}, "output_dir": {"values": [str(inside), "/tmp/else"]}},
                   base={**sweep().base, "lora_r": 16}, n_trials=2, parallel=1)
    with JobManager(settings(tmp_path, dataset_roots=[DATA]), worker_target=fake_workers.sweep_trial) as manager, \
            Sweeps(manager, poll_seconds=0.05) as sweeps:
        sweep_id = sweeps.create(config, confined=True).id
        view = wait_status(sweeps, sweep_id, {"completed"})
        by_dir = {t.params["output_dir"]: t for t in view.trials}
        assert by_dir[str(inside)].status == "completed"
        refused = by_dir["/tmp/else"]
        assert refused.status == "failed" and refused.job_id is None
        assert refused.error.startswith(f"output_dir: /tmp/else/trial-{refused.number} must be a folder strictly "
                                        "inside one of")
        assert [j.trial for j in manager.list(sweep_id=sweep_id)] == [by_dir[str(inside)].number]


def test_a_trials_best_step_is_the_step_of_the_weights_its_value_measures() -> None:
    """final_value: early stopping's best on the objective (its step); else the final evaluation, of the last
    step's weights, or of the best step's when keep_best restored them (early stopping on another metric)."""
    config = sweep(objective={"metric": "exact_match"}, sampler="random")
    evaluation = {"metrics": {"exact_match": {"before": 0.1, "after": 0.5}}}

    def job(result: dict[str, Any], final_metrics: dict[str, Any] | None = None) -> Job:
        return Job(id="j", status=JobStatus.completed, config=config.trial_config(config.first_point()),
                   created_at=0.0, progress={"step": 40}, result=result, final_metrics=final_metrics)

    best = {"step": 15, "metric": "exact_match", "value": 0.75, "checkpoint": "/out/checkpoint-15"}
    assert final_value(job({"best": best, "evaluation": evaluation}), config) == (0.75, 15)
    assert final_value(job({"evaluation": evaluation}), config) == (0.5, 40)
    assert final_value(job({}, {"eval_exact_match": 0.25}), config) == (0.25, 40)
    on_loss = {"step": 20, "metric": "eval_loss", "value": 1.5}
    assert final_value(job({"best": {**on_loss, "checkpoint": "/out/checkpoint-20"}, "evaluation": evaluation}),
                       config) == (0.5, 20)  # keep_best: the artefacts, hence the final evaluation, are step 20's
    assert final_value(job({"best": {**on_loss, "checkpoint": None}, "evaluation": evaluation}), config) == (0.5, 40)
    assert final_value(job({}), config) == (None, None)


def test_a_trial_the_pruner_gives_up_on_stops_early_with_a_save(tmp_path: Path) -> None:
    # With seed 11 the sampler draws trials 0 and 1 good, 2 and 3 worse at every evaluation: the median pruner
    # (two completed trials to start from) stops them.
    config = sweep(space={"learning_rate": {"low": 1e-4, "high": 1e-1, "log": True}}, sampler="random", seed=11,
                   n_trials=4, parallel=1, pruner="median", base={**sweep().base, "lora_r": 16, "max_steps": 40})
    with JobManager(settings(tmp_path), worker_target=fake_workers.sweep_trial) as manager, \
            Sweeps(manager, poll_seconds=0.05) as sweeps:
        sweep_id = sweeps.create(config).id
        view = wait_status(sweeps, sweep_id, {"completed"})
        pruned = [t for t in view.trials if t.status == "pruned"]
        assert pruned, view.trials
        study = Study(tmp_path / "home" / "sweeps" / f"{sweep_id}.db")
        for trial in pruned:
            job = manager.get(trial.job_id)
            assert job.status is JobStatus.stopped and job.checkpoint is not None  # stopped with a save
            assert job.progress is None or job.progress.get("step", 0) < 40
            # judged from its second evaluation on (MEDIAN_WARMUP_EVALUATIONS), never at its first
            values = study.study.trials[trial.number].intermediate_values
            assert len(values) >= 2
            # the leaderboard says where the pruner gave up on it, and at what value
            assert trial.pruned_at == max(values) and trial.value == values[trial.pruned_at], (trial, values)
        study.close()
        assert view.trials[0].status == "completed"  # the pruned rank below the completed
        assert all(t.pruned_at is None for t in view.trials if t.status != "pruned")


def test_a_trial_judged_at_its_last_evaluation_whose_job_completes_anyway_is_completed(tmp_path: Path) -> None:
    # Two evaluations a trial (steps 2 and 4): the median pruner judges from the second, the last, and with seed
    # 1 the grid's third trial is worse than the first two there. Its job is past its last step when the stop
    # comes and completes: a trial with a whole run and a final value, never reported as pruned.
    config = sweep(seed=1, n_trials=3, parallel=1, pruner="median", base={**sweep().base, "max_steps": 4})
    with JobManager(settings(tmp_path, max_concurrent_jobs=1),
                    worker_target=fake_workers.sweep_trial_slow_to_finish) as manager, \
            Sweeps(manager, poll_seconds=0.05) as sweeps:
        view = wait_status(sweeps, sweep_id := sweeps.create(config).id, {"completed"})
        assert [t.status for t in view.trials] == ["completed"] * 3, view.trials
        for trial in view.trials:
            assert manager.get(trial.job_id).status is JobStatus.completed
            assert trial.value == pytest.approx(final_loss(trial.params, steps=4))
        study = Study(tmp_path / "home" / "sweeps" / f"{sweep_id}.db")
        judged = [t.user_attrs.get("pruned_at") for t in study.study.trials]
        study.close()
        assert judged[2] == 4, judged  # the pruner did give up on it, at its last evaluation


def test_a_sweep_continues_after_a_restart(tmp_path: Path) -> None:
    config = sweep(parallel=1, base={**sweep().base, "max_steps": 16})
    manager = JobManager(settings(tmp_path, max_concurrent_jobs=1), worker_target=fake_workers.sweep_trial).start()
    sweeps = Sweeps(manager, poll_seconds=0.05).start()
    sweep_id = sweeps.create(config).id
    deadline = time.monotonic() + 60
    while sum(t.status == "completed" for t in sweeps.get(sweep_id).trials) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    sweeps.close()  # the server goes down mid-sweep: runners first, then the jobs stop with a save
    manager.close()
    with JobManager(settings(tmp_path, max_concurrent_jobs=1), worker_target=fake_workers.sweep_trial) as manager, \
            Sweeps(manager, poll_seconds=0.05) as sweeps:
        view = wait_status(sweeps, sweep_id, {"completed"})
        assert len(view.trials) == 6 and {t.status for t in view.trials} == {"completed"}
        for trial in view.trials:
            assert manager.get(trial.job_id).status is JobStatus.completed
        assert view.best.params == {"learning_rate": 1e-3, "lora_r": 16}


def test_tpe_with_the_halving_pruner_over_an_integer_step_range_runs_valid_trials(tmp_path: Path) -> None:
    config = sweep(space={"learning_rate": {"low": 1e-4, "high": 1e-2, "log": True},
                          "lora_r": {"low": 4, "high": 16, "step": 4}},
                   sampler="tpe", pruner="halving", n_trials=5, parallel=None, seed=5)
    assert config.space["lora_r"].model_dump() == {"low": 4, "high": 16, "step": 4}
    with JobManager(settings(tmp_path), worker_target=fake_workers.sweep_trial) as manager, \
            Sweeps(manager, poll_seconds=0.05) as sweeps:
        sweep_id = sweeps.create(config).id
        view = wait_status(sweeps, sweep_id, {"completed"})
        trials = view.trials
        assert len(trials) == 5 and {t.status for t in trials} <= {"completed", "pruned"}, trials
        assert any(t.status == "completed" for t in trials)
        for trial in trials:
            params = trial.params
            assert type(params["lora_r"]) is int and params["lora_r"] in (4, 8, 12, 16)
            assert 1e-4 <= params["learning_rate"] <= 1e-2
            job = manager.get(trial.job_id)  # the job is the base with the trial's values
            assert (job.config.lora_r, job.config.learning_rate) == (params["lora_r"], params["learning_rate"])
            assert job.status is (JobStatus.completed if trial.status == "completed" else JobStatus.stopped)
        assert view.best.value == min(t.value for t in trials if t.status == "completed")


def test_parallel_defaults_to_the_queues_slots(tmp_path: Path) -> None:
    with JobManager(settings(tmp_path, max_concurrent_jobs=3), worker_target=fake_workers.sweep_trial) as manager:
        folder = tmp_path / "home" / "sweeps"
        folder.mkdir(parents=True)
        unset = Study(folder / "sw-000000000001.db", sweep(parallel=None))
        given = Study(folder / "sw-000000000002.db", sweep(parallel=1))
        assert SweepRunner(manager, unset).parallel == 3  # never started: only its share of the queue is read
        assert SweepRunner(manager, given).parallel == 1
        unset.close()
        given.close()


def test_a_runner_looks_when_its_jobs_write_not_only_at_its_poll(tmp_path: Path) -> None:
    # A poll of 60 s: each trial needs a look to be submitted and one to be told, so polling alone would take
    # minutes; the runner is woken by its jobs' commits (an evaluation, the end) instead.
    with JobManager(settings(tmp_path), worker_target=fake_workers.sweep_trial) as manager, \
            Sweeps(manager, poll_seconds=60) as sweeps:
        started = time.monotonic()
        sweep_id = sweeps.create(sweep(n_trials=4, parallel=1)).id
        view = wait_status(sweeps, sweep_id, {"completed"}, timeout=100)
        assert [t.status for t in view.trials] == ["completed"] * 4
        assert time.monotonic() - started < 60
