"""A sweep's MLflow parent run (its base has report_to: [mlflow]): its trials' runs are children of it.

The server never imports mlflow (it brings pandas, seconds of import): the parent run is opened and closed by a
short child, `python -m tunestudio.worker.train.tracking`, and each trial's job gets the parent's id
(`mlflow_parent_run_id`), its name and the store, so its worker logs a child run.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from typing import Any

from tunestudio.sweeps.config import SweepConfig
from tunestudio.sweeps.views import SweepView

log = logging.getLogger(__name__)
CHILD_TIMEOUT_S = 300  # a fresh SQLite store runs MLflow's migrations first


def wanted(config: SweepConfig) -> bool:
    return "mlflow" in (config.base.get("report_to") or [])


def store(config: SweepConfig, default_uri: str) -> tuple[str, str]:
    """(tracking URI, experiment) of the sweep and its trials."""
    return (config.base.get("mlflow_tracking_uri") or default_uri,
            config.base.get("mlflow_experiment") or "tunestudio")


def _child(action: str, uri: str, experiment: str, data: dict[str, Any], *extra: str) -> dict[str, Any]:
    command = [sys.executable, "-m", "tunestudio.worker.train.tracking", action, "--uri", uri,
               "--experiment", experiment, "--data", json.dumps(data), *extra]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"mlflow: {exc}"}
    lines = done.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        answer = {}
    if "run_id" not in answer and "error" not in answer:
        answer["error"] = f"mlflow: the tracking child exited {done.returncode}: {done.stderr.strip()[-500:]}"
    return answer


def open_parent(sweep_id: str, config: SweepConfig, uri: str, experiment: str) -> dict[str, Any]:
    """Open the sweep's run: {run_id} or {error}."""
    params = {"sampler": config.sampler, "n_trials": config.budget, "pruner": config.pruner,
              "objective": config.objective.metric, "direction": config.objective.direction,
              **{f"space.{name}": dim.model_dump_json() for name, dim in config.space.items()}}
    return _child("open", uri, experiment, {"params": params, "tags": {"tunestudio.sweep_id": sweep_id,
                                                                       "tunestudio.kind": "sweep"}},
                  "--name", f"sweep {sweep_id}")


def close_parent(run_id: str, uri: str, experiment: str, view: SweepView) -> dict[str, Any]:
    """End the sweep's run with the best value and its trial, and each finished trial's value by number."""
    best = view.best
    tags: dict[str, Any] = {"tunestudio.status": view.status}
    if best is not None:
        tags.update({"tunestudio.best_trial": best.number, "tunestudio.best_job": best.job_id,
                     **{f"best.{k}": v for k, v in best.params.items()}})
    data = {"status": "FINISHED" if view.status == "completed" else "KILLED", "tags": tags,
            "metrics": {f"best_{view.objective.metric}": best.value} if best is not None else {}}
    answer = _child("close", uri, experiment, data, "--run-id", run_id)
    if "error" in answer:
        log.warning("sweep %s: its MLflow run %s not closed: %s", view.id, run_id, answer["error"])
    return answer
