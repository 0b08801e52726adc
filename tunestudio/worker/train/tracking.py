"""MLflow (report_to: [mlflow]): a job's run, and a sweep's parent run, in the job's tracking store.

Worker side only: mlflow (with pandas) is imported here, in a worker or in the short child a sweep starts
(`python -m tunestudio.worker.train.tracking`), never in the server. A job's run holds its params (the config without
secrets), every logged figure per step (the loss, the learning rate, each evaluation's, generation metrics
included), and at the end the evaluation before and after training (`before_<metric>`, `after_<metric>`), the
best step of early stopping, and where the artefacts are (the tag `tunestudio.output_dir`). A sweep's trial is a
child run of the sweep's run (`mlflow.parentRunId`). The default store is a SQLite file in the data directory,
created by the first process under a file lock (two trials starting at once would race its migrations).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import importlib.util
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tunestudio.worker.errors import UserError

MISSING = "report_to mlflow: the mlflow package is not installed (pip install 'tunestudio[mlflow]')"
_PARAM_CHARS = 6000  # MLflow's limit on a param's value
_open: list[MlflowRun] = []  # runs this process opened and has not ended (ended FAILED if the job fails)


def available() -> bool:
    return importlib.util.find_spec("mlflow") is not None


def _local_store(uri: str) -> Path | None:
    """The file a sqlite:/// URI names, else None."""
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


@contextlib.contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    """One process at a time creates a local store (MLflow's SQLite migrations are not safe to race)."""
    path = _local_store(uri)
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / ".lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def client(uri: str, experiment: str) -> tuple[Any, str]:
    """The store's client and the experiment's id (created if missing; a local store's artefacts beside it)."""
    if not available():
        raise UserError(MISSING)
    from mlflow.tracking import MlflowClient

    with _store_lock(uri):
        mlflow_client = MlflowClient(tracking_uri=uri)
        found = mlflow_client.get_experiment_by_name(experiment)
        if found is not None:
            return mlflow_client, found.experiment_id
        store = _local_store(uri)
        location = (store.parent / "artifacts").as_uri() if store is not None else None
        return mlflow_client, mlflow_client.create_experiment(experiment, artifact_location=location)


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            out[f"{prefix}{key}"] = text[:_PARAM_CHARS]
    return out


def _numbers(data: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in data.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")}


class MlflowRun:
    """One run in a tracking store, written through MlflowClient (no global active run)."""

    def __init__(self, uri: str, experiment: str, run_id: str) -> None:
        self.uri, self.experiment, self.run_id = uri, experiment, run_id
        self.client, _ = client(uri, experiment)
        self.ended = False

    @classmethod
    def start(cls, uri: str, experiment: str, name: str | None = None, parent: str | None = None,
              tags: dict[str, str] | None = None) -> MlflowRun:
        mlflow_client, experiment_id = client(uri, experiment)
        all_tags = dict(tags or {})
        if parent:
            all_tags["mlflow.parentRunId"] = parent
        run = mlflow_client.create_run(experiment_id, run_name=name, tags=all_tags)
        opened = cls(uri, experiment, run.info.run_id)
        _open.append(opened)
        return opened

    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in _flat(params).items()]
        for i in range(0, len(items), 100):  # MLflow takes at most 100 params a batch
            self.client.log_batch(self.run_id, params=items[i:i + 100])

    def log_metrics(self, metrics: dict[str, Any], step: int = 0) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, v, now, step) for k, v in _numbers(metrics).items()]
        if items:
            self.client.log_batch(self.run_id, metrics=items)

    def set_tags(self, tags: dict[str, Any]) -> None:
        for key, value in tags.items():
            if value is not None:
                self.client.set_tag(self.run_id, key, str(value))

    def end(self, status: str = "FINISHED") -> None:
        """FINISHED, KILLED (stopped) or FAILED."""
        if self.ended:
            return
        self.ended = True
        if self in _open:
            _open.remove(self)
        self.client.set_terminated(self.run_id, status=status)


def end_open_runs(status: str = "FAILED") -> None:
    """End every run this process left open (the job failed before its end was logged); never raises."""
    for run in list(_open):
        with contextlib.suppress(Exception):
            run.end(status)


# --- a job's run --------------------------------------------------------------------------
def job_run(cfg: Any) -> MlflowRun | None:
    """The job's run, when it reports to mlflow: started with its params. Raises UserError without mlflow."""
    if "mlflow" not in cfg.report_to:
        return None
    uri = cfg.mlflow_tracking_uri or os.environ.get("TUNESTUDIO_MLFLOW_URI")
    if not uri:
        raise UserError("report_to mlflow: no mlflow_tracking_uri (the studio fills it in at submit; a worker run "
                        "by hand needs it, or TUNESTUDIO_MLFLOW_URI)")
    run = MlflowRun.start(uri, cfg.mlflow_experiment, cfg.mlflow_run_name, cfg.mlflow_parent_run_id,
                          tags={"tunestudio.output_dir": cfg.output_dir or "", "tunestudio.model": cfg.model_name,
                                "tunestudio.method": cfg.method})
    run.log_params({k: v for k, v in cfg.public_dict().items()
                    if not k.startswith("mlflow_") and v not in (None, [], {})})
    return run


def callback(run: MlflowRun) -> Any:
    """A TrainerCallback that logs every figure the trainer logs, at its step (evaluations with the generation
    metrics early stopping adds: the callback runs after it)."""
    from transformers import TrainerCallback

    class MlflowCallback(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any):
            if logs:
                run.log_metrics(logs, step=state.global_step)

    return MlflowCallback()


def finish(run: MlflowRun, *, stopped: bool, output_dir: str | None, metrics: dict[str, Any],
           evaluation: Any = None, best: Any = None, reason: str = "") -> None:
    """The job's end: its final figures, the evaluation before and after, the best step, the artefacts' place."""
    run.log_metrics({f"final_{k}": v for k, v in metrics.items()})
    if evaluation is not None:
        figures = evaluation.model_dump() if hasattr(evaluation, "model_dump") else dict(evaluation)
        for name, pair in (figures.get("metrics") or {}).items():
            run.log_metrics({f"before_{name}": (pair or {}).get("before"), f"after_{name}": (pair or {}).get("after")})
    if best is not None:
        data = best.model_dump() if hasattr(best, "model_dump") else dict(best)
        run.log_metrics({f"best_{data['metric']}": data.get("value")}, step=int(data.get("step") or 0))
        run.set_tags({"tunestudio.best_step": data.get("step"), "tunestudio.best_checkpoint": data.get("checkpoint")})
    run.set_tags({"tunestudio.output_dir": output_dir, "tunestudio.reason": reason or None,
                  "tunestudio.status": "stopped" if stopped else "completed"})
    run.end("KILLED" if stopped else "FINISHED")


# --- a sweep's parent run, from a short child of the server ---------------------------------
def main(argv: list[str] | None = None) -> int:
    """`python -m tunestudio.worker.train.tracking open|close ...`: a sweep's parent run; prints JSON on stdout."""
    parser = argparse.ArgumentParser(prog="python -m tunestudio.worker.train.tracking")
    parser.add_argument("action", choices=["open", "close"])
    parser.add_argument("--uri", required=True)
    parser.add_argument("--experiment", required=True)
    parser.add_argument("--name")
    parser.add_argument("--run-id")
    parser.add_argument("--data", default="{}", help="open: {params, tags}; close: {status, metrics, tags}")
    args = parser.parse_args(argv)
    data = json.loads(args.data)
    try:
        if args.action == "open":
            run = MlflowRun.start(args.uri, args.experiment, args.name, tags=data.get("tags"))
            run.log_params(data.get("params") or {})
        else:
            run = MlflowRun(args.uri, args.experiment, args.run_id)
            run.log_metrics(data.get("metrics") or {})
            run.set_tags(data.get("tags") or {})
            run.end(data.get("status") or "FINISHED")
    except UserError as exc:
        print(json.dumps({"error": str(exc)}))
        return 2
    print(json.dumps({"run_id": run.run_id}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
