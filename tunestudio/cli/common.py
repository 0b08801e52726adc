"""What the verbs share: the two consoles, the settings and the manager (or one line saying why not, and exit 2),
and the small formats of a job's figures and outcome."""

from __future__ import annotations

import contextlib
import sqlite3
from typing import Any

import typer
from pydantic import ValidationError
from rich.console import Console

from tunestudio.events import Best
from tunestudio.jobs import Job, JobManager, JobNotFound, StoreError, open_error
from tunestudio.settings import Settings

console = Console(stderr=False)
err = Console(stderr=True)


def load_settings() -> Settings:
    """Settings from the environment, or one line naming what is wrong and an exit (no traceback)."""
    try:
        return Settings()
    except ValidationError as exc:
        for error in exc.errors():
            name = "TUNESTUDIO_" + "_".join(str(p) for p in error["loc"][:1]).upper()
            err.print(f"[red]{name}: {error['msg'].removeprefix('Value error, ')}[/red]")
        raise typer.Exit(2) from None


def own_manager() -> JobManager:
    """The manager of a command that runs its own job in the foreground (train, export, jobs resume, make-data).

    A CLI run owns only its own job: queued jobs of a server stay the server's. Its one worker is spawned, not
    forked from a prewarmed forkserver: a forkserver pays off over many jobs, and for one it costs more (it imports
    every kind's libraries before the worker can start, where a spawned worker imports only its job's: no torch
    for a data-making job, no bitsandbytes or wandb for a LoRA job that does not use them, worker/optional.py)."""
    settings = load_settings()
    return open_manager(settings.model_copy(update={"prewarm": False}), adopt_queued=False, start=True)


def open_manager(settings: Settings | None = None, *, start: bool = False, **options: Any) -> JobManager:
    """A manager on the data directory, or one line saying why the database cannot be used (no traceback)."""
    settings = settings or load_settings()
    manager: JobManager | None = None
    try:
        manager = JobManager(settings, **options)
        if start:  # recovery reads every job: a damaged file shows here (the context manager's start is a no-op)
            manager.start()
        return manager
    except StoreError as exc:
        message = str(exc)
    except sqlite3.DatabaseError as exc:
        message = str(open_error(settings.data_dir() / "tunestudio.db", exc))
    except OSError as exc:
        message = (f"cannot use the data directory {settings.home}: {exc.strerror or exc}; make it writable, or set "
                   "TUNESTUDIO_HOME to a folder you can write")
    if manager is not None:
        with contextlib.suppress(Exception):  # half-started on a damaged file: let go of what it holds
            manager.close()
    err.print(f"[red]{message}[/red]", soft_wrap=True)
    raise typer.Exit(2)


def get_or_exit(manager: JobManager, job_id: str) -> Job:
    try:
        return manager.get(job_id)
    except JobNotFound as exc:
        err.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None


def fmt_seconds(value: float | None) -> str:
    if value is None:
        return "–"
    minutes, seconds = divmod(int(value), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


def fmt(value: float | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def outcome(job: Job) -> str:
    """"stopped: stopped at step 40", or "completed" alone when the message would only repeat the status."""
    said = job.error or job.message
    return job.status.value if not said or said == job.status.value else f"{job.status.value}: {said}"


def best_text(best: Best) -> str:
    """A job's best evaluation (early stopping), and whether its artefacts are that step's weights (keep_best)."""
    return f"step {best.step}: {best.metric} {best.value:.4f}" + (" (the artefacts are its weights)"
                                                                  if best.checkpoint else "")
