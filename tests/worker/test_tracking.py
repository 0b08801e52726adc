"""report_to: [mlflow]: the config's words, the store filled in at submit, the API's confinement, and a run written
through worker/train/tracking.py read back with MLflow's own search."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from tunestudio import paths
from tunestudio.config import JobConfig
from tunestudio.events import Best, Evaluation
from tunestudio.jobs import admission
from tunestudio.settings import Settings
from tunestudio.worker.train import tracking

from ..helpers.jobs import DATA

BASE = {"model_name": "org/model", "local_datasets": [str(DATA / "alpaca.jsonl")]}


def test_report_to_spells_the_switches_and_keeps_mlflow_fields_to_mlflow() -> None:
    config = JobConfig.model_validate({**BASE, "report_to": ["wandb", "tensorboard", "mlflow", "wandb"]})
    assert config.report_to == ["wandb", "tensorboard", "mlflow"]
    assert config.enable_wandb and config.enable_tensorboard
    assert JobConfig.model_validate(config.public_dict()) == config
    with pytest.raises(ValidationError, match="mlflow_parent_run_id: applies with report_to mlflow only"):
        JobConfig.model_validate({**BASE, "mlflow_parent_run_id": "abc"})
    with pytest.raises(ValidationError, match="report_to"):
        JobConfig.model_validate({**BASE, "report_to": ["comet"]})


def test_the_store_is_filled_in_at_submit_and_the_api_takes_only_its_own(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(home=tmp_path / "home")
    checked = admission.check_train(JobConfig.model_validate({**BASE, "report_to": ["mlflow"]}), settings)
    assert checked.mlflow_tracking_uri == f"sqlite:///{tmp_path / 'home' / 'mlflow' / 'mlflow.db'}"
    assert admission.check_train(JobConfig.model_validate(BASE), settings).mlflow_tracking_uri is None
    monkeypatch.setenv("TUNESTUDIO_MLFLOW_URI", "http://127.0.0.1:5000")
    assert Settings(home=tmp_path / "home").mlflow_tracking_uri() == "http://127.0.0.1:5000"

    roots = settings.roots()
    for uri in ("http://127.0.0.1:5000", checked.mlflow_tracking_uri):
        paths.confine(JobConfig.model_validate({**BASE, "report_to": ["mlflow"], "mlflow_tracking_uri": uri}), roots)
    for uri in (f"sqlite:///{tmp_path / 'elsewhere.db'}", "file:///etc", "postgresql://db/x"):
        with pytest.raises(paths.PathRefused) as refused:
            paths.confine(JobConfig.model_validate({**BASE, "report_to": ["mlflow"], "mlflow_tracking_uri": uri}),
                          roots)
        assert refused.value.field == "mlflow_tracking_uri"


# MLflow 3.17's store uses a SQLAlchemy loader that SQLAlchemy 2.1 deprecates (MLflow's own code, read here in-process)
@pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy is deprecated")
def test_a_run_holds_params_figures_by_step_the_evaluation_and_the_best(tmp_path: Path) -> None:
    mlflow = pytest.importorskip("mlflow")
    uri = f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}"
    cfg = JobConfig.model_validate({**BASE, "report_to": ["mlflow"], "mlflow_tracking_uri": uri,
                                    "mlflow_run_name": "one job", "output_dir": str(tmp_path / "out"),
                                    "learning_rate": 0.003})
    run = tracking.job_run(cfg)
    assert run is not None
    run.log_metrics({"loss": 2.5, "learning_rate": 0.003, "note": "text", "nan": float("nan")}, step=1)
    run.log_metrics({"eval_loss": 2.0, "eval_exact_match": 0.25}, step=2)
    evaluation = Evaluation(rows=4, metrics={"eval_loss": {"before": 3.0, "after": 2.0},
                                             "exact_match": {"before": 0.0, "after": 0.5}})
    tracking.finish(run, stopped=False, output_dir=cfg.output_dir, metrics={"train_loss": 2.2},
                    evaluation=evaluation, best=Best(step=2, metric="eval_loss", value=2.0, checkpoint=None))
    mlflow.set_tracking_uri(uri)
    found = mlflow.search_runs(experiment_names=["tunestudio"], filter_string="tags.mlflow.runName = 'one job'")
    assert len(found) == 1
    row = found.iloc[0]
    assert row["status"] == "FINISHED"
    assert float(row["params.learning_rate"]) == 0.003 and row["params.model_name"] == "org/model"
    assert "params.mlflow_tracking_uri" not in found.columns
    assert (row["metrics.loss"], row["metrics.eval_exact_match"], row["metrics.final_train_loss"]) == (2.5, 0.25, 2.2)
    assert (row["metrics.before_exact_match"], row["metrics.after_exact_match"]) == (0.0, 0.5)
    assert row["metrics.best_eval_loss"] == 2.0 and row["tags.tunestudio.best_step"] == "2"
    assert row["tags.tunestudio.output_dir"] == cfg.output_dir
    assert "metrics.nan" not in found.columns
    tracking.end_open_runs()  # nothing left open: finish ended it
    assert mlflow.get_run(row["run_id"]).info.status == "FINISHED"
