"""The command line: `tunestudio train JOB.yaml`, `jobs list|show|stop|resume`, `serve`, `make-tiny-model DIR`.

The CLI is the parent side: it never imports torch or the HF libraries itself;
training runs in a supervised worker process.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from tunestudio.config import ConfigError, load_config
from tunestudio.events import Completed, Event, Failed, Log, StatusEvent, WarningEvent, parse_stream_event
from tunestudio.events import Progress as ProgressEvent
from tunestudio.jobs.manager import JobManager
from tunestudio.jobs.models import Job, JobConflict, JobNotFound, QueueFull
from tunestudio.jobs.status import JobStatus
from tunestudio.paths import PathRefused, resolve
from tunestudio.settings import Settings

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Fine-tune language models on your own machine.")
console = Console(stderr=False)
err = Console(stderr=True)


class _Interrupts:
    """Signal handlers only record; the loop acts. First Ctrl-C: stop and save. Second: cancel."""

    def __init__(self) -> None:
        self.count = 0
        self.handled = 0

    def __call__(self, signum: int, frame: object) -> None:
        self.count += 1


def _fmt_seconds(value: float | None) -> str:
    if value is None:
        return "–"
    minutes, seconds = divmod(int(value), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


def _fmt(value: float | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


@app.command()
def train(
    job_file: Annotated[Path, typer.Argument(help="A YAML or JSON job config.")],
    output_dir: Annotated[
        str | None, typer.Option(help="Where the artefacts go (default: under TUNESTUDIO_HOME).")
    ] = None,
) -> None:
    """Run one fine-tuning job with a live progress view. Ctrl-C once: stop and save; twice: cancel."""
    overrides = {"output_dir": output_dir} if output_dir else {}
    try:
        cfg = resolve(load_config(job_file, overrides))  # a bad field, or a missing file: nothing starts
    except (ConfigError, PathRefused) as exc:
        err.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    with _manager() as manager:
        try:
            job = manager.submit(cfg)
        except (PathRefused, QueueFull) as exc:
            err.print(f"[red]{exc}[/red]")
            raise typer.Exit(2) from None
        final = _follow(manager, job.id)
    if final.status is JobStatus.failed:
        raise typer.Exit(1)


jobs_app = typer.Typer(no_args_is_help=True, help="Jobs recorded in the data directory.")
app.add_typer(jobs_app, name="jobs")


@jobs_app.command("list")
def jobs_list(
    status: Annotated[list[JobStatus] | None, typer.Option(help="Only jobs with this status.")] = None,
    limit: Annotated[int, typer.Option(min=1)] = 20,
) -> None:
    """Jobs, newest first."""
    manager = JobManager(Settings())
    try:
        table = Table("id", "status", "model", "steps", "loss", "created", "message")
        for job in manager.list(status or None, limit=limit):
            progress = job.progress or {}
            table.add_row(
                job.id,
                job.status.value,
                Path(job.config.get("model_name", "")).name,
                f"{progress.get('step', 0)}/{progress.get('total_steps', 0)}" if progress else "–",
                _fmt(progress.get("loss"), ".4f"),
                datetime.fromtimestamp(job.created_at).strftime("%Y-%m-%d %H:%M"),
                (job.error or job.message)[:60],
            )
        console.print(table)
    finally:
        manager.close()


@jobs_app.command("show")
def jobs_show(job_id: str) -> None:
    """A job's status, config, last metrics and artefacts."""
    manager = JobManager(Settings())
    try:
        job = _get_or_exit(manager, job_id)
        table = Table(show_header=False, box=None)
        for name in ("id", "status", "phase", "message", "error", "output_dir", "checkpoint", "resumed_from",
                     "log_path"):
            value = getattr(job, name)
            if value not in (None, ""):
                table.add_row(name, str(value.value if isinstance(value, JobStatus) else value))
        table.add_row("resumable", "yes" if job.resumable else "no")
        console.print(table)
        if job.progress:
            console.print("[bold]last metrics[/]", {k: v for k, v in job.progress.items() if v is not None})
        console.print("[bold]config[/]", job.config)
        out = Path(job.output_dir) if job.output_dir else None
        if out and out.is_dir():
            console.print("[bold]artefacts[/]", ", ".join(sorted(p.name for p in out.iterdir())))
    finally:
        manager.close()


@jobs_app.command("stop")
def jobs_stop(
    job_id: str,
    cancel: Annotated[bool, typer.Option("--cancel", help="Stop without saving a checkpoint.")] = False,
    wait: Annotated[bool, typer.Option(help="Wait until the job has ended.")] = True,
) -> None:
    """Stop a job that a server or another `tunestudio train` runs; it saves a resumable checkpoint."""
    settings = Settings()
    manager = JobManager(settings)
    try:
        _get_or_exit(manager, job_id)
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
        console.print(f"job {job_id}: {job.status.value}: {job.error or job.message}")
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
    with _manager() as manager:
        _get_or_exit(manager, job_id)
        try:
            job = manager.resume(job_id, num_processes=num_processes)
        except (JobConflict, PathRefused, QueueFull) as exc:
            err.print(f"[red]{exc}[/red]")
            raise typer.Exit(2) from None
        final = _follow(manager, job.id)
    if final.status is JobStatus.failed:
        raise typer.Exit(1)


def _manager() -> JobManager:
    # A CLI run owns only its own job: queued jobs of a server stay the server's.
    return JobManager(Settings(), adopt_queued=False)


def _get_or_exit(manager: JobManager, job_id: str) -> Job:
    try:
        return manager.get(job_id)
    except JobNotFound as exc:
        err.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None


def _follow(manager: JobManager, job_id: str) -> Job:
    """Show a job's events until it ends; Ctrl-C once stops with save, twice cancels."""
    job = manager.get(job_id)
    console.print(f"job [bold]{job.id}[/bold]: {job.config['training_type']} fine-tune of {job.config['model_name']}")
    console.print(f"worker log: {job.log_path}")
    interrupts = _Interrupts()
    previous = signal.signal(signal.SIGINT, interrupts)
    records: list[ProgressEvent] = []
    completed: Completed | None = None
    bar = Progress(
        TextColumn("[bold]{task.fields[phase]:<15}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}  lr {task.fields[lr]}  {task.fields[tps]} tok/s  ETA {task.fields[eta]}"),
        console=console,
    )
    task = bar.add_task("job", total=None, phase="queued", loss="–", lr="–", tps="–", eta="–")
    try:
        with bar, manager.subscribe(job_id) as stream:
            while True:
                if interrupts.count > interrupts.handled:
                    interrupts.handled = interrupts.count
                    with contextlib.suppress(JobConflict):
                        if interrupts.count == 1:
                            bar.console.print("[yellow]stopping at the next step, saving (Ctrl-C again: cancel)[/]")
                            manager.stop(job_id, save=True)
                        else:
                            bar.console.print("[red]cancelling[/]")
                            manager.cancel(job_id)
                item = stream.get(timeout=0.2)
                if item is None:
                    continue
                event = parse_stream_event(item.data)
                if isinstance(event, StatusEvent):
                    bar.update(task, phase=event.status)
                else:
                    if isinstance(event, Completed):
                        completed = event
                    _show(event, bar, task, records)
                if item.is_end:
                    break
    finally:
        signal.signal(signal.SIGINT, previous)
    final = manager.get(job_id)
    _summary(final, completed, records)
    return final


def _show(event: Event, bar: Progress, task: int, records: list[ProgressEvent]) -> None:
    if isinstance(event, ProgressEvent):
        records.append(event)
        if event.loss is not None:
            bar.update(
                task,
                completed=event.step,
                total=event.total_steps or None,
                loss=_fmt(event.loss, ".4f"),
                lr=_fmt(event.learning_rate, ".2e"),
                tps=_fmt(event.tokens_per_second, ",.0f"),
                eta=_fmt_seconds(event.eta_seconds),
            )
        elif event.eval_loss is not None:
            bar.console.print(f"step {event.step}: eval loss {event.eval_loss:.4f}")
    elif isinstance(event, Log):
        bar.console.print(f"[dim]{event.message}[/dim]")
    elif isinstance(event, WarningEvent):
        bar.console.print(f"[yellow]warning: {event.message}[/yellow]")
    elif isinstance(event, Failed):
        bar.console.print(f"[red]failed: {event.message}[/red]")


def _summary(job: Job, done: Completed | None, records: list[ProgressEvent]) -> None:
    train_losses = [r for r in records if r.loss is not None]
    evals = [r for r in records if r.eval_loss is not None]
    colour = {"completed": "green", "failed": "red"}.get(job.status.value, "yellow")
    console.print(f"[bold {colour}]{job.status.value}[/]: {job.error or job.message}")
    if job.status is JobStatus.failed:
        console.print(f"details in {job.log_path}")
    table = Table(show_header=False, box=None)
    if done and done.output_dir:
        table.add_row("artefacts", done.output_dir)
    if job.checkpoint:
        table.add_row("checkpoint", job.checkpoint)
    if job.resumable:
        table.add_row("resume with", f"tunestudio jobs resume {job.id}")
    if train_losses:
        first, last = train_losses[0], train_losses[-1]
        table.add_row("train loss", f"{first.loss:.4f} (step {first.step}) → {last.loss:.4f} (step {last.step})")
    if evals:
        table.add_row("eval loss", f"{evals[0].eval_loss:.4f} (step {evals[0].step}) → "
                                   f"{evals[-1].eval_loss:.4f} (step {evals[-1].step})")
    console.print(table)
    for sample in done.samples if done else []:
        console.print(f"\n[bold]prompt[/]      {sample.prompt!r}")
        console.print(f"[bold]base model[/]  {sample.before!r}")
        console.print(f"[bold]fine-tuned[/]  {sample.after!r}")


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default 8765).")] = None,
) -> None:
    """Serve the HTTP API, the event streams and the web page."""
    import uvicorn

    from tunestudio.api import create_app
    from tunestudio.api.security import check_bind

    settings = Settings()
    host = host or settings.host
    port = port or settings.port
    try:
        check_bind(settings, host)
    except SystemExit as exc:
        err.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    console.print(f"tunestudio on http://{host}:{port}  (API docs: /docs, data: {settings.data_dir()})")
    uvicorn.run(create_app(settings), host=host, port=port, log_level="warning")


@app.command("make-tiny-model")
def make_tiny_model(
    directory: Annotated[Path, typer.Argument(help="Folder to write the model and tokenizer to.")],
    seed: Annotated[int, typer.Option(help="Seed for the weights.")] = 1234,
) -> None:
    """Build the embedded tiny Llama and its byte-level tokenizer (deterministic from the seed)."""
    # Runs in a child so this process stays free of torch, like every other command.
    import multiprocessing as mp

    started = time.monotonic()
    ctx = mp.get_context("spawn")
    proc = ctx.Process(target=_build_tiny, args=(str(directory), seed))
    proc.start()
    proc.join()
    if proc.exitcode != 0:
        err.print(f"[red]building the tiny model failed (exit code {proc.exitcode})[/red]")
        raise typer.Exit(1)
    console.print(f"tiny model written to {directory} in {time.monotonic() - started:.1f}s")


def _build_tiny(directory: str, seed: int) -> None:
    from tunestudio.worker.tiny import build_tiny_model

    build_tiny_model(directory, seed)


@app.command("make-dataset")
def make_dataset(
    directory: Annotated[Path, typer.Argument(help="Folder to write the bundled dataset to.")] = Path("examples/data"),
) -> None:
    """Write the bundled dataset (alpaca, sharegpt, messages, prompt/completion and text forms)."""
    from tunestudio.worker.tiny import write_dataset

    for path in write_dataset(directory):
        console.print(str(path))


if __name__ == "__main__":
    sys.exit(app())
