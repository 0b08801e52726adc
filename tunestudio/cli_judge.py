"""`tunestudio judge JOB [--against base|OTHER_JOB] [--prompts FILE]`: a pairwise judge in the terminal.

Both models answer in an inference worker of this process (as `tunestudio chat` does; this process never
imports torch); the judge is the OpenAI-compatible endpoint the environment names (tunestudio/judge/).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from tunestudio.judge.core import Row, Summary

console = Console()
err = Console(stderr=True)


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
    json_out: Annotated[bool, typer.Option("--json", help="Print the judgement as one JSON object.")] = False,
) -> None:
    """Judge a job's answers against its base model's (or another job's) with a judge model, both orders."""
    from tunestudio.api.judging import pool_answerer
    from tunestudio.inference import InferencePool, UnknownModel, resolve
    from tunestudio.jobs.executor import inference_executor
    from tunestudio.jobs.manager import JobManager
    from tunestudio.judge import Endpoint, JudgeNotConfigured, PromptsError
    from tunestudio.judge import prompts as prompt_source
    from tunestudio.judge.core import run
    from tunestudio.settings import Settings

    settings = Settings()
    manager = JobManager(settings)
    pool = InferencePool(settings, inference_executor)
    try:
        try:
            job = manager.get(job_id)
        except LookupError:
            err.print(f"[red]no job {job_id}[/red]")
            raise typer.Exit(2) from None
        other = f"{job_id}:base" if against == "base" else against
        try:
            for model_id in (job_id, other):
                resolve(manager, model_id)
            endpoint = Endpoint.from_env(judge_url, judge_model)
            asked = prompt_source.read(prompts) if prompts else prompt_source.held_out(job.result)
        except (UnknownModel, JudgeNotConfigured, PromptsError) as exc:
            err.print(f"[red]{exc}[/red]")
            raise typer.Exit(2) from None
        if not asked:
            err.print("[red]the job has no held-out rows answered by its evaluation: give --prompts FILE[/red]")
            raise typer.Exit(2)
        asked = asked[:limit] if limit else asked
        if not json_out:
            console.print(f"judging job {job_id} against {other} on {len(asked)} prompts; judge {endpoint.model} at "
                          f"{endpoint.url}")
        mine, theirs = pool_answerer(pool, manager, job_id, max_tokens), pool_answerer(pool, manager, other, max_tokens)
        judgement = run(asked, mine, theirs, endpoint,
                        on_row=None if json_out else (lambda row: console.print(_row_line(row))))
    finally:
        pool.close()
        manager.close()
    if json_out:
        print(json.dumps({"job_id": job_id, "against": other, "judge": endpoint.describe(), **judgement.as_dict()}))
    else:
        console.print(summary_table(judgement.summary(), job_id, other))
    if judgement.rows and judgement.summary().judged == 0:
        raise typer.Exit(1)
