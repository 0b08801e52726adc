"""`tunestudio train JOB.yaml [--output-dir DIR]`: one fine-tuning job in the foreground, with a live progress
view (cli/follow.py). Ctrl-C once: stop and save; twice: cancel."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tunestudio.cli.common import err, own_manager
from tunestudio.cli.follow import follow
from tunestudio.config import ConfigError
from tunestudio.config.files import load_job_file
from tunestudio.jobs import JobStatus, QueueFull
from tunestudio.paths import PathRefused, resolve


def train(
    job_file: Annotated[Path, typer.Argument(help="A YAML or JSON job config.")],
    output_dir: Annotated[
        str | None, typer.Option(help="Where the artefacts go (default: under TUNESTUDIO_HOME).")
    ] = None,
) -> None:
    """Run one fine-tuning job with a live progress view (named as the file's `name` says). Ctrl-C once: stop and
    save; twice: cancel."""
    overrides = {"output_dir": output_dir} if output_dir else {}
    try:
        config, name = load_job_file(job_file, overrides)
        cfg = resolve(config)  # a bad field, or a missing file: nothing starts
    except (ConfigError, PathRefused) as exc:
        err.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    with own_manager() as manager:
        try:
            job = manager.submit(cfg)
        except (PathRefused, QueueFull) as exc:
            err.print(f"[red]{exc}[/red]")
            raise typer.Exit(2) from None
        if name:
            manager.rename(job.id, name, None)
        final = follow(manager, job.id)
    if final.status is JobStatus.failed:
        raise typer.Exit(1)
