"""`tunestudio judge JOB [--against base|OTHER_JOB] [--prompts FILE]`: a pairwise judge in the terminal.

Both models answer in an inference worker of this process (as `tunestudio chat` does; this process never
imports torch); the judge is the OpenAI-compatible endpoint the environment names (tunestudio/judge/). Ctrl-C
cancels the judgement: the calls under way are cut and the rows judged before are printed (exit code 130).
"""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer
from rich.table import Table

from tunestudio.cli.common import console, err
from tunestudio.judge import Judgement, Prompt, Row, Summary

if TYPE_CHECKING:
    from tunestudio.jobs import JobManager

T = TypeVar("T")


def _rate(rate: object) -> str:
    value, low, high = (getattr(rate, k) for k in ("value", "low", "high"))
    return "–" if value is None else f"{value:.1%} [{low:.1%}, {high:.1%}]"


def summary_table(summary: Summary, model: str, against: str) -> Table:
    table = Table(title=f"{model} against {against}: {summary.judged} of {summary.rows} rows judged in both orders"
                  + (f", {summary.errors} errors" if summary.errors else ""), title_justify="left")
    table.add_column("outcome")
    table.add_column("rows", justify="right")
    table.add_column("rate [95% interval]", justify="right")
    for label, count, rate in (("win", summary.wins, summary.win_rate), ("tie", summary.ties, summary.tie_rate),
                               ("loss", summary.losses, summary.loss_rate)):
        table.add_row(label, str(count), _rate(rate))
    table.add_row("score (win + tie/2)", "", _rate(summary.score))
    return table


def _row_line(row: Row) -> str:
    colour = {"win": "green", "loss": "red", "tie": "yellow", "error": "magenta"}[row.outcome]
    what = row.error if row.outcome == "error" else (row.first.reason if row.first and row.first.reason else "")
    prompt = row.prompt.replace("\n", " ")
    line = f"[{colour}]{row.outcome:5}[/] {row.index + 1:>3}. {prompt[:60]}"
    return line + (f"  [dim]{what[:80]}[/dim]" if what else "")


@contextmanager
def cancel_on_interrupt() -> Iterator[threading.Event]:
    """Ctrl-C sets the event: the answer and the judge's call under way are cut and the rows judged before are
    kept (and printed); a second Ctrl-C interrupts at once."""
    cancel = threading.Event()

    def on_interrupt(signum: int, frame: object) -> None:
        if cancel.is_set():
            raise KeyboardInterrupt
        cancel.set()
        err.print("[yellow]cancelling the judgement (Ctrl-C again to quit at once)…[/yellow]")

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield cancel
    finally:
        signal.signal(signal.SIGINT, previous)


def judge(
    job_id: Annotated[str, typer.Argument(help="The job whose model is judged.")],
    against: Annotated[str, typer.Option(help='"base" (the job\'s base model) or another job id.')] = "base",
    prompts: Annotated[Path | None, typer.Option(help="A prompt file (.txt, .jsonl, .json); default: the job's "
                                                      "held-out rows.")] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="Judge at most this many prompts.")] = None,
    max_tokens: Annotated[int, typer.Option(min=1, max=4096, help="Each model's answer, at most.")] = 256,
    judge_url: Annotated[str | None, typer.Option(help="The judge's OpenAI-compatible base URL "
                                                       "(default: TUNESTUDIO_JUDGE_URL).")] = None,
    judge_model: Annotated[str | None, typer.Option(
        help="The judge's model (default: TUNESTUDIO_JUDGE_MODEL).")] = None,
    judge_deadline: Annotated[float | None, typer.Option(
        help="Seconds each verdict may take, retries included (default: TUNESTUDIO_JUDGE_DEADLINE_S, else 120).")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the judgement as one JSON object.")] = False,
) -> None:
    """Judge a job's answers against its base model's (or another job's) with a judge model, both orders.
    Ctrl-C cancels: the rows judged before are printed, and the exit code is 130."""
    from tunestudio.api.judging import pool_answerer
    from tunestudio.inference import InferencePool
    from tunestudio.jobs import JobManager, inference_executor
    from tunestudio.judge import Endpoint, run
    from tunestudio.settings import Settings

    settings = Settings()
    manager = JobManager(settings)
    pool = InferencePool(settings, inference_executor)
    try:
        other, asked = _what_to_judge(manager, job_id, against, prompts, limit)
        endpoint = _checked(lambda: Endpoint.from_env(judge_url, judge_model, deadline_s=judge_deadline))
        if not json_out:
            console.print(f"judging job {job_id} against {other} on {len(asked)} prompts; judge {endpoint.model} at "
                          f"{endpoint.url} (Ctrl-C cancels)")
        with cancel_on_interrupt() as cancel:
            mine = pool_answerer(pool, manager, job_id, max_tokens, cancel=cancel)
            theirs = pool_answerer(pool, manager, other, max_tokens, cancel=cancel)
            judgement = run(asked, mine, theirs, endpoint.cancellable(cancel), stopped=cancel.is_set,
                            on_row=None if json_out else (lambda row: console.print(_row_line(row))))
    finally:
        pool.close()
        manager.close()
    _report(judgement, job_id, other, endpoint.describe(), len(asked), cancel.is_set(), json_out)


def _checked(make: Callable[[], T]) -> T:
    """make(), or exit 2 with the message of what the user got wrong."""
    from tunestudio.inference import UnknownModel
    from tunestudio.judge import JudgeNotConfigured, PromptsError

    try:
        return make()
    except (UnknownModel, JudgeNotConfigured, PromptsError) as exc:
        err.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None


def _what_to_judge(manager: JobManager, job_id: str, against: str, prompts: Path | None,
                   limit: int | None) -> tuple[str, list[Prompt]]:
    """The model judged against, and the prompts; exit 2 naming what is missing."""
    from tunestudio.inference import resolve
    from tunestudio.judge import held_out_prompts, read_prompts

    try:
        job = manager.get(job_id)
    except LookupError:
        err.print(f"[red]no job {job_id}[/red]")
        raise typer.Exit(2) from None
    other = f"{job_id}:base" if against == "base" else against
    for model_id in (job_id, other):
        _checked(lambda model_id=model_id: resolve(manager, model_id))
    asked = _checked(lambda: read_prompts(prompts) if prompts else held_out_prompts(job.result))
    if not asked:
        err.print("[red]the job has no held-out rows answered by its evaluation: give --prompts FILE[/red]")
        raise typer.Exit(2)
    return other, asked[:limit] if limit else asked


def _report(judgement: Judgement, job_id: str, other: str, judge: dict[str, str], asked: int, cancelled: bool,
            json_out: bool) -> None:
    if json_out:
        print(json.dumps({"job_id": job_id, "against": other, "judge": judge, **judgement.as_dict(),
                          **({"cancelled": True} if cancelled else {})}))
    else:
        console.print(summary_table(judgement.summary(), job_id, other))
    if cancelled:
        err.print(f"[yellow]cancelled after {len(judgement.rows)} of {asked} rows[/yellow]")
        raise typer.Exit(130)
    if judgement.rows and judgement.summary().judged == 0:
        raise typer.Exit(1)
