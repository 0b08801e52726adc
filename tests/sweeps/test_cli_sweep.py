"""`tunestudio sweep SWEEP.yaml`: the trials run through the queue (scripted workers) and a table ranks them."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tunestudio.cli import app
from tunestudio.cli import sweep as cli_sweep
from tunestudio.jobs.manager import JobManager

from ..helpers import fake_workers
from ..helpers.jobs import DATA


def write(tmp_path: Path, **overrides: object) -> Path:
    sweep = {"base": {"model_name": "org/model", "local_datasets": [str(DATA / "alpaca.jsonl")], "max_steps": 4,
                      "eval_steps": 2},
             "space": {"lora_r": {"values": [4, 16]}}, "sampler": "grid", "n_trials": 2,
             "objective": {"metric": "eval_loss", "mode": "min"}, **overrides}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    return path


def test_the_cli_runs_a_sweep_and_names_the_best(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_sweep, "JobManager", functools.partial(JobManager, worker_target=fake_workers.sweep_trial))
    result = CliRunner().invoke(app, ["sweep", str(write(tmp_path))])
    assert result.exit_code == 0, result.output
    assert "completed, 2/2 trials" in result.output
    assert "best: trial" in result.output and "lora_r=16" in result.output.split("best: trial")[1]
    number, job_id = re.search(r"best: trial (\d+) \(job (\S+)\)", result.output).groups()
    shown = CliRunner().invoke(app, ["jobs", "show", job_id])  # the job says which sweep and trial it is
    assert shown.exit_code == 0, shown.output
    sweep_id = re.search(r"sweep (sw-[0-9a-f]+):", result.output).group(1)
    assert re.search(rf"^ *sweep +{sweep_id}, trial {number} *$", shown.output, re.MULTILINE), shown.output


def test_a_bad_sweep_file_names_the_field_and_starts_nothing(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["sweep", str(write(tmp_path, space={"lora_rank": {"values": [4]}}))])
    assert result.exit_code == 2
    assert "space.lora_rank: JobConfig has no field 'lora_rank'" in result.output
    assert not (tmp_path / "home" / "sweeps").exists()


def test_a_sweep_file_keeps_its_secret_for_the_trials_and_out_of_what_is_stored(tmp_path: Path) -> None:
    """load_sweep makes the base's paths absolute through a JSON dump of a JobConfig, where a secret reads
    "**********": the trials must get the real token, and the dump the study stores none."""
    path = write(tmp_path, base={"model_name": "org/model", "local_datasets": [str(DATA / "alpaca.jsonl")],
                                 "max_steps": 4, "eval_steps": 2, "hf_token": "hf_from_the_file"})
    config = cli_sweep.load_sweep(path)
    trial = config.trial_config(config.first_point(), 0)
    assert trial.hf_token is not None and trial.hf_token.get_secret_value() == "hf_from_the_file"
    assert "hf_from_the_file" not in str(config.model_dump(mode="json"))
