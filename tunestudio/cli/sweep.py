"""`tunestudio sweep SWEEP.yaml`: run a sweep's trials through the queue, with a live leaderboard.

Like every CLI process this one never imports torch: the trials are jobs in worker processes. Ctrl-C once:
no new trials, the running ones stop with a save; twice: leave at once (the manager still saves them).
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from pydantic import ValidationError
from rich.live import Live
from rich.table import Table

from tunestudio.cli.common import console, err
from tunestudio.config import field_errors
from tunestudio.jobs import JobManager
from tunestudio.paths import PathRefused, resolve
from tunestudio.settings import Settings
from tunestudio.sweeps import BeforeAfter, SweepConfig, Sweeps, SweepView


def load_sweep(path: Path) -> SweepConfig:
    """Read and validate a sweep file; its base's local paths made absolute and checked. Raises typer.Exit(2)."""
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
        config = SweepConfig.model_validate(data)
        resolved = resolve(config.points[0].job)
    except (OSError, json.JSONDecodeError, yaml.YAMLError, PathRefused) as exc:
        err.print(f"[red]{path}: {exc}[/red]", soft_wrap=True)
        raise typer.Exit(2) from None
    except ValidationError as exc:
        for error in field_errors(exc.errors()):
            err.print(f"[red]{error['field'] or 'sweep'}: {error['message']}[/red]", soft_wrap=True)
        raise typer.Exit(2) from None
    # The base's paths as the first job resolved them (absolute): a server that continues the sweep, from another
    # folder, reads the same files.
    return config.with_base({k: getattr(resolved, k) for k, v in config.base.items()
                             if isinstance(v, (str, list)) and k in type(resolved).model_fields})


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "–" if value is None else str(value)


def leaderboard(sweep: SweepView) -> Table:
    objective = sweep.objective
    done = sum(t.status in ("completed", "pruned", "failed") for t in sweep.trials)
    table = Table(title=f"sweep {sweep.id}: {sweep.status}, {done}/{sweep.n_trials} trials, "
                        f"{objective.metric} ({objective.mode})")
    for column in ("#", "params", "status", objective.metric, "best step", "steps", "evaluation (base → trained)",
                   "job"):
        table.add_column(column)
    best = sweep.best.number if sweep.best is not None else None
    for trial in sweep.trials:
        params = ", ".join(f"{k}={_fmt(v)}" for k, v in trial.params.items())
        style = "bold green" if trial.number == best else None
        status = trial.status if trial.pruned_at is None else f"pruned at step {trial.pruned_at}"
        table.add_row(str(trial.number), params, status, _fmt(trial.value), _fmt(trial.best_step),
                      _fmt(trial.steps), _evaluation(trial.evaluation), trial.job_id or "–", style=style)
    return table


def _evaluation(evaluation: dict[str, BeforeAfter] | None) -> str:
    if not evaluation:
        return "–"
    return ", ".join(f"{name} {_fmt(m.before)} → {_fmt(m.after)}" for name, m in evaluation.items()
                     if m.before is not None or m.after is not None)


def sweep(sweep_file: Annotated[Path, typer.Argument(help="A YAML or JSON sweep: base, space, sampler, "
                                                            "n_trials, objective, pruner, parallel.")]) -> None:
    """Run a hyperparameter sweep: each trial an ordinary job of the queue; a live table ranks them."""
    config = load_sweep(sweep_file)
    interrupts = [0]

    def record(signum: int, frame: object) -> None:  # a handler only records; the loop acts
        interrupts[0] += 1

    manager = JobManager(Settings(), adopt_queued=False).start()
    sweeps = Sweeps(manager)  # not started: this process runs its own sweep, a server's stay the server's
    previous = signal.signal(signal.SIGINT, record)
    handled = 0
    try:
        sweep_id = sweeps.create(config).id
        with Live(leaderboard(sweeps.get(sweep_id)), console=console, refresh_per_second=2) as live:
            while True:
                view = sweeps.get(sweep_id)
                live.update(leaderboard(view))
                if view.status in ("completed", "stopped") or interrupts[0] > 1:
                    break
                if interrupts[0] > handled:
                    handled = interrupts[0]
                    live.console.print("[yellow]stopping: no new trials, the running ones save "
                                       "(Ctrl-C again: leave now)[/]")
                    sweeps.stop(sweep_id)
                time.sleep(0.5)
        best = view.best
        if best is not None:
            console.print(f"best: trial {best.number} (job {best.job_id}): "
                          f"{view.objective.metric} {_fmt(best.value)} with "
                          + ", ".join(f"{k}={_fmt(v)}" for k, v in best.params.items()))
        if view.mlflow_run_id:
            console.print(f"mlflow: the sweep's run {view.mlflow_run_id}, its trials child runs")
    finally:
        signal.signal(signal.SIGINT, previous)
        sweeps.close()
        manager.close()
    if view.best is None:
        raise typer.Exit(1)
