"""A job in the foreground (train, export, jobs resume): its events as a live progress bar until it ends, then
its summary: the losses, the best step, the samples and the before/after evaluation table."""

from __future__ import annotations

import contextlib
import signal
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from tunestudio.cli.common import best_text, console, fmt, fmt_seconds, outcome
from tunestudio.config import METHOD_MAIN_METRIC, JobConfig
from tunestudio.events import Completed, Evaluation, Event, Failed, Log, StatusEvent, WarningEvent, parse_stream_event
from tunestudio.events import Phase as PhaseEvent
from tunestudio.events import Progress as ProgressEvent
from tunestudio.export_config import ExportConfig
from tunestudio.jobs import Job, JobConflict, JobManager, JobStatus
from tunestudio.make_data_config import MakeDataConfig

_LABELS = {"exact_match": "exact match", "token_f1": "token F1", "rouge_l": "ROUGE-L", "eval_loss": "eval loss",
           "perplexity": "perplexity"}


class _Interrupts:
    """Signal handlers only record; the loop acts. First Ctrl-C: stop and save. Second: cancel."""

    def __init__(self) -> None:
        self.count = 0
        self.handled = 0

    def __call__(self, signum: int, frame: object) -> None:
        self.count += 1


def follow(manager: JobManager, job_id: str) -> Job:
    """Show a job's events until it ends; Ctrl-C once stops with save, twice cancels."""
    job = manager.get(job_id)
    config = job.config
    method = config.method if isinstance(config, JobConfig) else "sft"
    main_metric = METHOD_MAIN_METRIC.get(method)  # the method's own figure beside the loss (sft, pretrain: none)
    _announce(job)
    interrupts = _Interrupts()
    previous = signal.signal(signal.SIGINT, interrupts)
    records: list[ProgressEvent] = []
    try:
        completed = _watch(manager, job_id, interrupts, records, main_metric)
    finally:
        signal.signal(signal.SIGINT, previous)
    final = manager.get(job_id)
    summary(final, completed, records, main_metric)
    return final


def _announce(job: Job) -> None:
    """The job's first lines: what it is, and where its worker's log is."""
    config = job.config
    if isinstance(config, ExportConfig):
        console.print(f"job [bold]{job.id}[/bold]: export of job {job.source_job} as {config.target} "
                      f"to {job.output_dir}")
    elif isinstance(config, JobConfig):
        console.print(f"job [bold]{job.id}[/bold]: {config.method} ({config.training_type.value}) of "
                      f"{config.model_name}")
    elif isinstance(config, MakeDataConfig):
        console.print(f"job [bold]{job.id}[/bold]: {config.rows} {config.task} rows from {config.teacher.model} "
                      f"into {config.output}")
    else:
        console.print(f"job [bold]{job.id}[/bold]: benchmark of job {job.source_job}")
    console.print(f"worker log: {job.log_path}")


def _watch(manager: JobManager, job_id: str, interrupts: _Interrupts, records: list[ProgressEvent],
           main_metric: str | None) -> Completed | None:
    """The live bar over the job's event stream until its end; the Completed event, when one came."""
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
    with bar, manager.subscribe(job_id) as stream:
        while True:
            _act_on_interrupts(manager, job_id, interrupts, bar.console)
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
                show(event, bar, task, records, main_metric)
            if item.is_end:
                return completed


def _act_on_interrupts(manager: JobManager, job_id: str, interrupts: _Interrupts, out: Console) -> None:
    """A Ctrl-C not yet acted on: the first stops the job with a save, a later one cancels it."""
    if interrupts.count <= interrupts.handled:
        return
    interrupts.handled = interrupts.count
    with contextlib.suppress(JobConflict):
        if interrupts.count == 1:
            out.print("[yellow]stopping at the next step, saving (Ctrl-C again: cancel)[/]")
            manager.stop(job_id, save=True)
        else:
            out.print("[red]cancelling[/]")
            manager.cancel(job_id)


def main_value(event: ProgressEvent, main_metric: str | None) -> float | None:
    return (event.extra or {}).get(main_metric) if main_metric else None


def show(event: Event, bar: Progress, task: int, records: list[ProgressEvent], main_metric: str | None) -> None:
    if isinstance(event, ProgressEvent):
        records.append(event)
        if event.loss is not None:
            main = main_value(event, main_metric)
            bar.update(
                task,
                completed=event.step,
                total=event.total_steps or None,
                loss=fmt(event.loss, ".4f"),
                main=f"{main_metric} {main:.4f}  " if main is not None else "",
                lr=fmt(event.learning_rate, ".2e"),
                tps=fmt(event.tokens_per_second, ",.0f"),
                eta=fmt_seconds(event.eta_seconds),
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


def summary(job: Job, done: Completed | None, records: list[ProgressEvent], main_metric: str | None) -> None:
    train_losses = [r for r in records if r.loss is not None]
    evals = [r for r in records if r.eval_loss is not None]
    colour = {"completed": "green", "failed": "red"}.get(job.status.value, "yellow")
    console.print(f"[bold {colour}]{job.status.value}[/]{outcome(job)[len(job.status.value):]}")
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
    mains = [(r.step, v) for r in train_losses if (v := main_value(r, main_metric)) is not None]
    if mains:
        (first_step, first_value), (last_step, last_value) = mains[0], mains[-1]
        table.add_row(str(main_metric), f"{first_value:.4f} (step {first_step}) → {last_value:.4f} (step {last_step})")
    if evals:
        table.add_row("eval loss", f"{evals[0].eval_loss:.4f} (step {evals[0].step}) → "
                                   f"{evals[-1].eval_loss:.4f} (step {evals[-1].step})")
    if done and done.best:
        table.add_row("best", best_text(done.best))
    if done and "rows_made" in done.metrics:  # a make_data job: rows, what the gates removed, requests
        m = done.metrics
        removed = ", ".join(f"{k.removeprefix('removed/')} {v:,.0f}" for k, v in m.items() if k.startswith("removed/"))
        table.add_row("rows made", f"{m['rows_made']:,.0f} (+{m['rows_existing']:,.0f} already there)")
        table.add_row("removed", removed or "none")
        table.add_row("requests", f"{m['requests']:,.0f} ({m['requests_failed']:,.0f} failed)")
    if done and "dedupe_removed" in done.metrics:
        table.add_row("duplicates removed", f"{done.metrics['dedupe_removed']:,.0f} (dedupe)")
    console.print(table)
    for sample in done.samples if done else []:
        console.print(f"\n[bold]prompt[/]      {sample.prompt!r}")
        console.print(f"[bold]base model[/]  {sample.before!r}")
        console.print(f"[bold]fine-tuned[/]  {sample.after!r}")
    print_evaluation(console, done.evaluation if done else None)


# --- the evaluation: the base model and the fine-tuned one on the held-out rows -----------------------------
def _cell(name: str, value: float | None) -> str:
    if value is None:
        return "–"
    if name in ("exact_match", "token_f1", "rouge_l"):
        return f"{value:.1%}"
    return f"{value:.4g}"


def evaluation_table(evaluation: Evaluation | dict[str, Any]) -> Table:
    """The before/after table: one row per metric, the change in the last column."""
    if not isinstance(evaluation, Evaluation):
        evaluation = Evaluation.model_validate(evaluation)
    table = Table(title=f"evaluation on {evaluation.rows} held-out rows" if evaluation.rows
                  else "evaluation on the eval split", title_justify="left")
    table.add_column("metric")
    table.add_column("base model", justify="right")
    table.add_column("fine-tuned", justify="right")
    table.add_column("change", justify="right")
    for name, pair in evaluation.metrics.items():
        if pair.before is None and pair.after is None:
            continue
        change = "–"
        if pair.before is not None and pair.after is not None:
            delta = pair.after - pair.before
            change = f"{delta:+.1%}" if name in ("exact_match", "token_f1", "rouge_l") else f"{delta:+.4g}"
        table.add_row(_LABELS.get(name, name), _cell(name, pair.before), _cell(name, pair.after), change)
    return table


def print_evaluation(out: Console, evaluation: Evaluation | None) -> None:
    if evaluation is None:
        return
    out.print()
    out.print(evaluation_table(evaluation))
    for example in evaluation.examples[:3]:
        out.print(f"[bold]held-out[/]    {escape(repr(example.prompt))}")
        out.print(f"[bold]reference[/]   {escape(repr(example.reference))}")
        out.print(f"[bold]base model[/]  {escape(repr(example.before))}")
        out.print(f"[bold]fine-tuned[/]  {escape(repr(example.after))}")
