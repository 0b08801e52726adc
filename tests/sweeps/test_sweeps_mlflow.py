"""A sweep reporting to MLflow (scripted trials): its parent run is opened and closed by a child, so the process
that runs the sweep never imports mlflow; each trial's job is told the parent run, its name and the store."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ..helpers.jobs import DATA

mlflow = pytest.importorskip("mlflow", reason="the mlflow extra: pip install 'tunestudio[mlflow]' (make setup)")

# MLflow 3.17's store uses a SQLAlchemy loader that SQLAlchemy 2.1 deprecates (read here in-process)
pytestmark = [pytest.mark.timeout(300),
              pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy is deprecated")]

SCRIPT = """
import json, sys, time
from tests.helpers import fake_workers
from tunestudio.jobs.manager import JobManager
from tunestudio.settings import Settings
from tunestudio.sweeps import SweepConfig, Sweeps

body = json.loads(sys.argv[2])
settings = Settings(home=sys.argv[1], max_concurrent_jobs=2, prewarm=False)
with JobManager(settings, worker_target=fake_workers.sweep_trial) as manager, Sweeps(manager, 0.05) as sweeps:
    sweep_id = sweeps.create(SweepConfig.model_validate(body)).id
    deadline = time.monotonic() + 120
    while sweeps.get(sweep_id).status != "completed":
        assert time.monotonic() < deadline, sweeps.get(sweep_id)
        time.sleep(0.05)
    view = sweeps.get(sweep_id)
    configs = {t.number: manager.get(t.job_id).config.public_dict() for t in view.trials}
print(json.dumps({"view": view.model_dump(mode="json"), "configs": configs, "uri": settings.mlflow_tracking_uri(),
                  "heavy": [m for m in ("mlflow", "pandas", "torch") if m in sys.modules]}))
"""


def test_the_sweep_is_a_parent_run_and_its_trials_are_told_so(tmp_path: Path) -> None:
    body = {"base": {"model_name": "org/model", "local_datasets": [str(DATA / "alpaca.jsonl")], "max_steps": 4,
                     "eval_steps": 2, "report_to": ["mlflow"], "mlflow_experiment": "sweeps"},
            "space": {"learning_rate": {"values": [1e-3, 1e-2]}, "lora_r": {"values": [4, 16]}},
            "sampler": "grid", "objective": {"metric": "eval_loss"}, "parallel": 2}
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "home"), json.dumps(body)], cwd=root,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["heavy"] == []  # the parent run came from a child
    view, uri = out["view"], out["uri"]
    assert uri == f"sqlite:///{tmp_path / 'home' / 'mlflow' / 'mlflow.db'}"
    parent = view["mlflow_run_id"]
    assert parent and view["mlflow_error"] is None
    for number, config in out["configs"].items():
        assert (config["mlflow_parent_run_id"], config["mlflow_run_name"], config["mlflow_tracking_uri"],
                config["mlflow_experiment"]) == (parent, f"{view['id']} trial {number}", uri, "sweeps")

    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["sweeps"], filter_string="tags.`tunestudio.kind` = 'sweep'")
    assert list(runs["run_id"]) == [parent]
    run = runs.iloc[0]
    assert (run["status"], run["tags.mlflow.runName"], run["tags.tunestudio.sweep_id"]) == (
        "FINISHED", f"sweep {view['id']}", view["id"])
    assert run["metrics.best_eval_loss"] == pytest.approx(view["best"]["value"])
    assert run["tags.tunestudio.best_job"] == view["best"]["job_id"]
    assert (run["params.sampler"], run["params.n_trials"], run["params.direction"]) == ("grid", "4", "minimize")
    assert json.loads(run["params.space.lora_r"]) == {"values": [4, 16]}
