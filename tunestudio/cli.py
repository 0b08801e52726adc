"""The command line: `tunestudio train JOB.yaml`, `tunestudio make-tiny-model DIR`.

The CLI is the parent side: it never imports torch or the HF libraries itself;
training runs in a supervised worker process.
"""

from __future__ import annotations

import queue
import signal
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from tunestudio.config import ConfigError, load_config
from tunestudio.events import Completed, Event, Failed, Log, Phase, WarningEvent
from tunestudio.events import Progress as ProgressEvent
from tunestudio.settings import Settings

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Fine-tune language models on your own machine.")
console = Console(stderr=False)
err = Console(stderr=True)


def new_job_id() -> str:
    return datetime.now().strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


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
    from tunestudio.jobs.supervisor import Supervisor

    settings = Settings()
    overrides = {"output_dir": output_dir} if output_dir else {}
    try:
        cfg = load_config(job_file, overrides)
    except ConfigError as exc:
        err.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    job_id = new_job_id()
    if not cfg.output_dir:
        cfg = cfg.model_copy(update={"output_dir": str(settings.jobs_dir() / job_id / "output")})
    log_path = settings.logs_dir() / f"{job_id}.log"

    events: queue.Queue[Event] = queue.Queue()
    supervisor = Supervisor(
        cfg,
        events.put,
        log_path=log_path,
        stop_grace_seconds=settings.stop_grace_seconds,
        kill_after_seconds=settings.kill_after_seconds,
        exit_after_terminal_seconds=settings.exit_after_terminal_seconds,
    )
    interrupts = _Interrupts()
    previous = signal.signal(signal.SIGINT, interrupts)
    records: list[ProgressEvent] = []
    console.print(f"job [bold]{job_id}[/bold]: {cfg.training_type.value} fine-tune of {cfg.model_name}")
    console.print(f"worker log: {log_path}")
    bar = Progress(
        TextColumn("[bold]{task.fields[phase]:<15}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}  lr {task.fields[lr]}  {task.fields[tps]} tok/s  ETA {task.fields[eta]}"),
        console=console,
        transient=False,
    )
    task = bar.add_task("job", total=None, phase="starting", loss="–", lr="–", tps="–", eta="–")
    try:
        supervisor.start()
        with bar:
            while True:
                if interrupts.count > interrupts.handled:
                    interrupts.handled = interrupts.count
                    if interrupts.count == 1:
                        bar.console.print("[yellow]stopping at the next step and saving (Ctrl-C again to cancel)[/]")
                        supervisor.stop(save=True)
                    else:
                        bar.console.print("[red]cancelling[/]")
                        supervisor.cancel()
                try:
                    event = events.get(timeout=0.2)
                except queue.Empty:
                    if supervisor.wait(0) is not None and events.empty():
                        break
                    continue
                _show(event, bar, task, records)
    finally:
        signal.signal(signal.SIGINT, previous)
    outcome = supervisor.wait()
    assert outcome is not None
    _summary(outcome, records, log_path)
    if outcome.kind == "failed":
        raise typer.Exit(1)


def _show(event: Event, bar: Progress, task: int, records: list[ProgressEvent]) -> None:
    if isinstance(event, Phase):
        bar.update(task, phase=event.phase)
    elif isinstance(event, ProgressEvent):
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


def _summary(outcome, records: list[ProgressEvent], log_path: Path) -> None:
    train_losses = [r for r in records if r.loss is not None]
    evals = [r for r in records if r.eval_loss is not None]
    colour = {"completed": "green", "stopped": "yellow", "cancelled": "yellow", "failed": "red"}[outcome.kind]
    console.print(f"[bold {colour}]{outcome.kind}[/]: {outcome.message}")
    if outcome.kind == "failed":
        console.print(f"details in {log_path}")
    table = Table(show_header=False, box=None)
    done: Completed | None = outcome.completed
    if done and done.output_dir:
        table.add_row("artefacts", done.output_dir)
    if done and done.checkpoint:
        table.add_row("checkpoint", done.checkpoint)
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


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":
    sys.exit(app())
