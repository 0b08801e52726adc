"""`tunestudio jobs list|show|rows|stop|resume`: the jobs recorded in the data directory, a server's and other
`tunestudio train` runs' too."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from tunestudio.cli.common import (
    best_text,
    console,
    err,
    fmt,
    get_or_exit,
    load_settings,
    open_manager,
    outcome,
    own_manager,
)
from tunestudio.cli.follow import follow
from tunestudio.events import Best
from tunestudio.jobs import ORDER_KEYS, JobConflict, JobNotFound, JobStatus, QueueFull, owned_artefacts
from tunestudio.paths import PathRefused

jobs_app = typer.Typer(no_args_is_help=True, help="Jobs recorded in the data directory.")


@jobs_app.command("list")
def jobs_list(
    status: Annotated[list[JobStatus] | None, typer.Option(help="Only jobs with this status.")] = None,
    limit: Annotated[int, typer.Option(min=1)] = 20,
) -> None:
    """Jobs, newest first."""
    manager = open_manager()
    try:
        table = Table("id", "status", "model", "steps", "loss", "created", "message")
        for job in manager.list(status or None, limit=limit):
            progress = job.progress or {}
            table.add_row(
                job.id,
                job.status.value,
                Path(job.config.model_name).name if job.spec.trains else f"{job.kind} of {job.source_job}",
                f"{progress.get('step', 0)}/{progress.get('total_steps', 0)}" if progress else "–",
                fmt(progress.get("loss"), ".4f"),
                datetime.fromtimestamp(job.created_at).strftime("%Y-%m-%d %H:%M"),
                (job.error or job.message)[:60],
            )
        console.print(table)
    finally:
        manager.close()


@jobs_app.command("show")
def jobs_show(job_id: str) -> None:
    """A job's status, config, last metrics and artefacts."""
    manager = open_manager()
    try:
        job = get_or_exit(manager, job_id)
        table = Table(show_header=False, box=None)
        for name in ("id", "status", "phase", "message", "error", "output_dir", "checkpoint", "resumed_from",
                     "log_path"):
            value = getattr(job, name)
            if value not in (None, ""):
                table.add_row(name, str(value.value if isinstance(value, JobStatus) else value))
        table.add_row("resumable", "yes" if job.resumable else "no")
        if job.sweep_id is not None:  # a sweep's trial: `tunestudio sweep` and GET /api/sweeps/{id} rank it
            table.add_row("sweep", f"{job.sweep_id}, trial {job.trial}")
        best = (job.result or {}).get("best")
        if best:
            table.add_row("best", best_text(Best.model_validate(best)))
        held = (job.result or {}).get("held_out")
        if held:  # the rows its evaluation is on: a clone names this file (held_out_rows) to hold them out again
            table.add_row("held out", f"{held['rows']} rows, seed {held['seed']}: {held['file']}"
                          + (f" (the rows of {held['source']})" if held.get("source") else ""))
        for key, value in ((job.result or {}).get("resolved") or {}).items():  # what the worker chose
            table.add_row(f"decided: {key}", str(value))
        console.print(table)
        if job.progress:
            console.print("[bold]last metrics[/]", {k: v for k, v in job.progress.items() if v is not None})
        warnings = [e.data.get("message", "") for e in manager.messages(job_id) if e.kind == "warning"]
        for text in warnings:  # rows the dataset dropped, a converter's doubts: said where they are seen
            console.print(f"[bold yellow]warning[/] {text}", highlight=False)
        console.print("[bold]config[/]", job.config.public_dict())
        names = [path.name for path in owned_artefacts(job)]  # what it wrote: never a file the user put there
        if names:
            console.print("[bold]artefacts[/]", ", ".join(names))
    finally:
        manager.close()


@jobs_app.command("rows")
def jobs_rows(
    job_id: str,
    order: Annotated[str, typer.Option(help="worst: highest loss (lowest metric) first; best: the other way.")]
    = "worst",
    by: Annotated[str, typer.Option(help="loss, exact_match, token_f1 or rouge_l.")] = "loss",
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 10,
    offset: Annotated[int, typer.Option(min=0)] = 0,
) -> None:
    """A finished job's held-out rows one by one, worst first: loss, the reference and the model's answers."""
    if order not in ("worst", "best") or by not in ORDER_KEYS:
        err.print(f"[red]--order is worst or best, --by one of {', '.join(ORDER_KEYS)}[/red]")
        raise typer.Exit(2)
    manager = open_manager()
    try:
        try:
            found = manager.eval_rows(job_id, by=by, order=order, limit=limit, offset=offset)
        except (JobNotFound, JobConflict) as exc:
            err.print(f"[red]{exc}[/red]")
            raise typer.Exit(2) from None
        table = Table("row", "loss (base → tuned)", *([by] if by != "loss" else []), "prompt", "reference",
                      "fine-tuned", "base model")
        for r in found.rows:
            place = f"{Path(r['file']).name}:{r['line']}" if r.get("file") else f"#{r['index']}"
            metric = [] if by == "loss" else [fmt(r.get(by), ".3f")]
            table.add_row(place, f"{fmt(r.get('loss_before'), '.3f')} → {fmt(r.get('loss'), '.3f')}", *metric,
                          r["prompt"], r["reference"], "–" if r.get("answer") is None else r["answer"],
                          "–" if r.get("answer_before") is None else r["answer_before"])
        console.print(table)
        console.print(f"rows {offset + 1}–{offset + len(found.rows)} of {found.total}, {order} {by} first; loss: "
                      f"{found.loss}", highlight=False)
    finally:
        manager.close()


@jobs_app.command("stop")
def jobs_stop(
    job_id: str,
    cancel: Annotated[bool, typer.Option("--cancel", help="Stop without saving a checkpoint.")] = False,
    wait: Annotated[bool, typer.Option(help="Wait until the job has ended.")] = True,
) -> None:
    """Stop a job that a server or another `tunestudio train` runs; it saves a resumable checkpoint."""
    settings = load_settings()
    manager = open_manager(settings)
    try:
        get_or_exit(manager, job_id)
        try:
            job = manager.stop(job_id, save=not cancel)
        except JobConflict as exc:
            err.print(f"[red]{exc}[/red]")
            raise typer.Exit(2) from None
        console.print(f"{'cancel' if cancel else 'stop'} asked for job {job_id} ({job.status.value})")
        if not wait:
            return
        # The owner hears of it within request_poll_seconds, then the worker has its grace period.
        grace = settings.stop_grace_seconds if cancel else settings.save_grace_seconds
        deadline = time.monotonic() + settings.request_poll_seconds + grace + settings.kill_after_seconds + 30
        while not job.status.is_terminal and time.monotonic() < deadline:
            time.sleep(0.2)
            job = manager.get(job_id)
        if not job.status.is_terminal:
            err.print(f"[red]job {job_id} is still {job.status.value}[/red]")
            raise typer.Exit(1)
        console.print(f"job {job_id}: {outcome(job)}")
        if job.resumable:
            console.print(f"resume with: tunestudio jobs resume {job_id}")
    finally:
        manager.close()


@jobs_app.command("resume")
def jobs_resume(
    job_id: str,
    num_processes: Annotated[
        int | None, typer.Option(min=1, max=256, help="Ranks for the rest of the job; default: as before.")
    ] = None,
) -> None:
    """Resume a stopped, interrupted or failed job from its checkpoint, in the foreground."""
    with own_manager() as manager:
        get_or_exit(manager, job_id)
        try:
            job = manager.resume(job_id, num_processes=num_processes)
        except (JobConflict, PathRefused, QueueFull) as exc:
            err.print(f"[red]{exc}[/red]")
            raise typer.Exit(2) from None
        final = follow(manager, job.id)
    if final.status is JobStatus.failed:
        raise typer.Exit(1)
