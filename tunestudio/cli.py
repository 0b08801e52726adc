"""The command line: `tunestudio train JOB.yaml`, `export JOB_ID --to TARGET`,
`jobs list|show|stop|resume`, `sweep SWEEP.yaml`, `bench JOB --tasks ...`, `data inspect FILE…`, `serve`,
`make-tiny-model DIR`.

The CLI is the parent side: it never imports torch or the HF libraries itself;
training runs in a supervised worker process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import sys
import time
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from tunestudio.cli_bench import bench
from tunestudio.cli_chat import chat, print_evaluation
from tunestudio.cli_judge import judge
from tunestudio.cli_sweep import sweep
from tunestudio.config import METHOD_MAIN_METRIC, ConfigError, JobConfig, format_validation_error
from tunestudio.config.files import load_job_file
from tunestudio.data_report.cli import data_app
from tunestudio.events import Best, Completed, Event, Failed, Log, StatusEvent, WarningEvent, parse_stream_event
from tunestudio.events import Phase as PhaseEvent
from tunestudio.events import Progress as ProgressEvent
from tunestudio.export_config import ExportConfig, ExportOptions
from tunestudio.jobs import artefacts
from tunestudio.jobs.evalrows import ORDER_KEYS
from tunestudio.jobs.manager import JobManager
from tunestudio.jobs.models import Job, JobConflict, JobNotFound, QueueFull
from tunestudio.jobs.status import JobStatus
from tunestudio.jobs.store import StoreError, open_error
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
    """Run one fine-tuning job with a live progress view (named as the file's `name` says). Ctrl-C once: stop and
    save; twice: cancel."""
    overrides = {"output_dir": output_dir} if output_dir else {}
    try:
        config, name = load_job_file(job_file, overrides)
        cfg = resolve(config)  # a bad field, or a missing file: nothing starts
    except (ConfigError, PathRefused) as exc:
        err.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    with _manager() as manager:
        try:
            job = manager.submit(cfg)
        except (PathRefused, QueueFull) as exc:
            err.print(f"[red]{exc}[/red]")
            raise typer.Exit(2) from None
        if name:
            manager.rename(job.id, name, None)
        final = _follow(manager, job.id)
    if final.status is JobStatus.failed:
        raise typer.Exit(1)


app.command()(chat)
app.command()(sweep)
app.command()(bench)
app.command()(judge)


class ExportTargetOption(StrEnum):
    merged = "merged"
    gguf = "gguf"
    gguf_lora = "gguf-lora"
    hub = "hub"


class ExportDtypeOption(StrEnum):
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


@app.command()
def export(
    job_id: Annotated[str, typer.Argument(help="The finished job to export.")],
    to: Annotated[ExportTargetOption, typer.Option("--to", help="What to produce.")],
    quantization: Annotated[
        str | None, typer.Option(help="gguf: f16 (default), bf16, q8_0, f32, q4_k_m; gguf-lora: f16, bf16, q8_0, f32.")
    ] = None,
    dtype: Annotated[ExportDtypeOption, typer.Option(help="merged: the weights' type.")] = ExportDtypeOption.fp32,
    output: Annotated[str | None, typer.Option(help="Folder for the files (default: exports/ in the job's output).")]
    = None,
    repo: Annotated[str | None, typer.Option(help="hub: the repository ('name' or 'owner/name').")] = None,
    public: Annotated[bool, typer.Option("--public", help="hub: a public repository (default: private).")] = False,
    merged: Annotated[bool, typer.Option("--merged", help="hub: push the merged model, not the adapter.")] = False,
    checkpoint: Annotated[str | None, typer.Option(help="Export this checkpoint-N folder instead of the end.")] = None,
) -> None:
    """Export a finished job as a merged model, a GGUF (with an Ollama Modelfile), a GGUF LoRA, or to the hub.

    The hub token is read from HF_TOKEN; it is never stored. Ctrl-C stops the export and keeps nothing.
    """
    token = os.environ.get("HF_TOKEN") if to is ExportTargetOption.hub else None
    try:
        options = ExportOptions(
            target=to.value, quantization=quantization.lower() if quantization else None, dtype=dtype.value,
            output_dir=output, repo=repo, private=not public, hub_content="merged" if merged else "adapter",
            checkpoint=checkpoint, hf_token=token,
        )
    except ValidationError as exc:
        for item in format_validation_error(exc):
            err.print(f"[red]{item['field']}: {item['message']}[/red]")
        raise typer.Exit(2) from None
    with _manager() as manager:
        try:
            job = manager.export(job_id, options)
        except (JobNotFound, JobConflict, PathRefused, QueueFull) as exc:
            err.print(f"[red]{exc}[/red]")
            raise typer.Exit(2) from None
        final = _follow(manager, job.id)
    if final.status is JobStatus.failed:
        raise typer.Exit(1)


jobs_app = typer.Typer(no_args_is_help=True, help="Jobs recorded in the data directory.")
app.add_typer(jobs_app, name="jobs")
app.add_typer(data_app, name="data")  # data inspect: the dataset report (tunestudio/data_report/)


@jobs_app.command("list")
def jobs_list(
    status: Annotated[list[JobStatus] | None, typer.Option(help="Only jobs with this status.")] = None,
    limit: Annotated[int, typer.Option(min=1)] = 20,
) -> None:
    """Jobs, newest first."""
    manager = _open_manager()
    try:
        table = Table("id", "status", "model", "steps", "loss", "created", "message")
        for job in manager.list(status or None, limit=limit):
            progress = job.progress or {}
            table.add_row(
                job.id,
                job.status.value,
                Path(job.config.model_name).name if job.spec.trains else f"{job.kind} of {job.source_job}",
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
    manager = _open_manager()
    try:
        job = _get_or_exit(manager, job_id)
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
            table.add_row("best", _best_text(Best.model_validate(best)))
        held = (job.result or {}).get("held_out")
        if held:  # the rows its evaluation is on: a clone names this file (held_out_rows) to hold them out again
            table.add_row("held out", f"{held['rows']} rows, seed {held['seed']}: {held['file']}"
                          + (f" (the rows of {held['source']})" if held.get("source") else ""))
        console.print(table)
        if job.progress:
            console.print("[bold]last metrics[/]", {k: v for k, v in job.progress.items() if v is not None})
        warnings = [e.data.get("message", "") for e in manager.messages(job_id) if e.kind == "warning"]
        for text in warnings:  # rows the dataset dropped, a converter's doubts: said where they are seen
            console.print(f"[bold yellow]warning[/] {text}", highlight=False)
        console.print("[bold]config[/]", job.config.public_dict())
        names = [path.name for path in artefacts.owned(job)]  # what it wrote: never a file the user put there
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
    manager = _open_manager()
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
            metric = [] if by == "loss" else [_fmt(r.get(by), ".3f")]
            table.add_row(place, f"{_fmt(r.get('loss_before'), '.3f')} → {_fmt(r.get('loss'), '.3f')}", *metric,
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
    settings = _settings()
    manager = _open_manager(settings)
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
        console.print(f"job {job_id}: {_outcome(job)}")
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


def _settings() -> Settings:
    """Settings from the environment, or one line naming what is wrong and an exit (no traceback)."""
    try:
        return Settings()
    except ValidationError as exc:
        for error in exc.errors():
            name = "TUNESTUDIO_" + "_".join(str(p) for p in error["loc"][:1]).upper()
            err.print(f"[red]{name}: {error['msg'].removeprefix('Value error, ')}[/red]")
        raise typer.Exit(2) from None


def _manager() -> JobManager:
    # A CLI run owns only its own job: queued jobs of a server stay the server's.
    return _open_manager(adopt_queued=False, start=True)


def _open_manager(settings: Settings | None = None, *, start: bool = False, **options: Any) -> JobManager:
    """A manager on the data directory, or one line saying why the database cannot be used (no traceback)."""
    settings = settings or _settings()
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


def _get_or_exit(manager: JobManager, job_id: str) -> Job:
    try:
        return manager.get(job_id)
    except JobNotFound as exc:
        err.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None


def _follow(manager: JobManager, job_id: str) -> Job:
    """Show a job's events until it ends; Ctrl-C once stops with save, twice cancels."""
    job = manager.get(job_id)
    config = job.config
    method = config.method if isinstance(config, JobConfig) else "sft"
    main_metric = METHOD_MAIN_METRIC.get(method)  # the method's own figure beside the loss (sft, pretrain: none)
    if isinstance(config, ExportConfig):
        console.print(f"job [bold]{job.id}[/bold]: export of job {job.source_job} as {config.target} "
                      f"to {job.output_dir}")
    elif isinstance(config, JobConfig):
        console.print(f"job [bold]{job.id}[/bold]: {method} ({config.training_type.value}) of {config.model_name}")
    else:
        console.print(f"job [bold]{job.id}[/bold]: benchmark of job {job.source_job}")
    console.print(f"worker log: {job.log_path}")
    interrupts = _Interrupts()
    previous = signal.signal(signal.SIGINT, interrupts)
    records: list[ProgressEvent] = []
    completed: Completed | None = None
    bar = Progress(
        TextColumn("[bold]{task.fields[phase]:<15}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}  {task.fields[main]}lr {task.fields[lr]}  {task.fields[tps]} tok/s  "
                   "ETA {task.fields[eta]}"),
        console=console,
    )
    task = bar.add_task("job", total=None, phase="queued", loss="–", main="", lr="–", tps="–", eta="–")
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
                elif isinstance(event, PhaseEvent):  # a step inside a phase: evaluating the base model...
                    count = f" {event.done}/{event.total}" if event.total else ""
                    bar.update(task, phase=f"{event.phase.replace('_', ' ')}{count}")
                else:
                    if isinstance(event, Completed):
                        completed = event
                    _show(event, bar, task, records, main_metric)
                if item.is_end:
                    break
    finally:
        signal.signal(signal.SIGINT, previous)
    final = manager.get(job_id)
    _summary(final, completed, records, main_metric)
    return final


def _main_value(event: ProgressEvent, main_metric: str | None) -> float | None:
    return (event.extra or {}).get(main_metric) if main_metric else None


def _show(event: Event, bar: Progress, task: int, records: list[ProgressEvent], main_metric: str | None) -> None:
    if isinstance(event, ProgressEvent):
        records.append(event)
        if event.loss is not None:
            main = _main_value(event, main_metric)
            bar.update(
                task,
                completed=event.step,
                total=event.total_steps or None,
                loss=_fmt(event.loss, ".4f"),
                main=f"{main_metric} {main:.4f}  " if main is not None else "",
                lr=_fmt(event.learning_rate, ".2e"),
                tps=_fmt(event.tokens_per_second, ",.0f"),
                eta=_fmt_seconds(event.eta_seconds),
            )
        elif event.eval_loss is not None:
            bar.console.print(f"step {event.step}: eval loss {event.eval_loss:.4f}")
        else:  # an export's progress: percent of the whole export
            bar.update(task, completed=event.step, total=event.total_steps or None)
    elif isinstance(event, Log):
        bar.console.print(f"[dim]{event.message}[/dim]")
    elif isinstance(event, WarningEvent):
        bar.console.print(f"[yellow]warning: {event.message}[/yellow]")
    elif isinstance(event, Failed):
        bar.console.print(f"[red]failed: {event.message}[/red]")


def _summary(job: Job, done: Completed | None, records: list[ProgressEvent], main_metric: str | None) -> None:
    train_losses = [r for r in records if r.loss is not None]
    evals = [r for r in records if r.eval_loss is not None]
    colour = {"completed": "green", "failed": "red"}.get(job.status.value, "yellow")
    console.print(f"[bold {colour}]{job.status.value}[/]{_outcome(job)[len(job.status.value):]}")
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
    mains = [(r.step, v) for r in train_losses if (v := _main_value(r, main_metric)) is not None]
    if mains:
        (first_step, first_value), (last_step, last_value) = mains[0], mains[-1]
        table.add_row(str(main_metric), f"{first_value:.4f} (step {first_step}) → {last_value:.4f} (step {last_step})")
    if evals:
        table.add_row("eval loss", f"{evals[0].eval_loss:.4f} (step {evals[0].step}) → "
                                   f"{evals[-1].eval_loss:.4f} (step {evals[-1].step})")
    if done and done.best:
        table.add_row("best", _best_text(done.best))
    if done and "dedupe_removed" in done.metrics:
        table.add_row("duplicates removed", f"{done.metrics['dedupe_removed']:,.0f} (dedupe)")
    console.print(table)
    for sample in done.samples if done else []:
        console.print(f"\n[bold]prompt[/]      {sample.prompt!r}")
        console.print(f"[bold]base model[/]  {sample.before!r}")
        console.print(f"[bold]fine-tuned[/]  {sample.after!r}")
    print_evaluation(console, done.evaluation if done else None)


def _outcome(job: Job) -> str:
    """"stopped: stopped at step 40", or "completed" alone when the message would only repeat the status."""
    said = job.error or job.message
    return job.status.value if not said or said == job.status.value else f"{job.status.value}: {said}"


def _best_text(best: Best) -> str:
    """A job's best evaluation (early stopping), and whether its artefacts are that step's weights (keep_best)."""
    return f"step {best.step}: {best.metric} {best.value:.4f}" + (" (the artefacts are its weights)"
                                                                  if best.checkpoint else "")


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default 8765).")] = None,
) -> None:
    """Serve the HTTP API, the event streams and the web page."""
    import uvicorn

    from tunestudio.api import create_app
    from tunestudio.api.http import server_config
    from tunestudio.api.security import check_bind

    settings = _settings()
    host = host or settings.host
    port = port or settings.port
    try:
        check_bind(settings, host)
    except SystemExit as exc:
        err.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    # The app checks Host headers against the address it is really bound to.
    settings = settings.model_copy(update={"host": host, "port": port})
    manager = _open_manager(settings, start=True)  # a damaged or read-only database: one line, before serving
    console.print(f"tunestudio on http://{host}:{port}  (API docs: /docs, data: {settings.data_dir()})")
    try:
        # A header read timeout and a connection cap (api/http.py): slow or idle sockets cannot hold the server.
        uvicorn.Server(server_config(create_app(settings, manager), settings, host, port)).run()
    finally:
        manager.close()


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
    """Write the bundled dataset (alpaca, sharegpt, messages, prompt/completion and text forms; preference pairs,
    unpaired feedback and prompts with answers for DPO/ORPO, KTO and GRPO)."""
    from tunestudio.worker.tiny import write_dataset
    from tunestudio.worker.tiny_methods import write_method_datasets

    for path in [*write_dataset(directory), *write_method_datasets(directory)]:
        console.print(str(path))


if __name__ == "__main__":
    sys.exit(app())
