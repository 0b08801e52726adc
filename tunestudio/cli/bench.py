"""`tunestudio bench JOB --tasks T1,T2 [--eval-file FILE] [--limit N]`: lm-evaluation-harness, before and after.

The benchmark is a job of the queue (kind "bench", worker/bench.py) whose worker calls a server's
/v1/completions (loglikelihood tasks) and /v1/chat/completions (generation tasks). This command serves them
itself for the run: a small app with the completions and chat routes only, on 127.0.0.1 at a free port (with
TUNESTUDIO_API_TOKEN set, the worker gets the token), and an inference worker of this process answering it;
this process never imports torch or the harness. Ctrl-C cancels.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError
from rich.table import Table

from tunestudio.cli.common import console, err

if TYPE_CHECKING:
    from tunestudio.bench_config import BenchOptions
    from tunestudio.jobs import Job, JobManager
SERVER_START_S = 30.0


def _pm(value: float | None, stderr: float | None, signed: bool = False) -> str:
    if value is None:
        return "–"
    text = f"{value:+.4f}" if signed else f"{value:.4f}"
    return f"{text} ± {stderr:.4f}" if stderr is not None else text


def results_table(result: dict[str, Any]) -> Table:
    """The figures as a table: per task and metric, before, after and the difference, each ± its standard error."""
    models = result.get("models", {})
    table = Table(title=f"{result.get('harness', 'lm-eval')}: {models.get('before')} → {models.get('after')}"
                  + (f", limit {result['limit']}" if result.get("limit") else ""), title_justify="left")
    for name, justify in (("task", "left"), ("version", "right"), ("n", "right"), ("metric", "left"),
                          ("before", "right"), ("after", "right"), ("difference", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for task, figures in result.get("tasks", {}).items():
        for metric, value in figures.get("metrics", {}).items():
            table.add_row(task, str(figures.get("version") or "–"), str(figures.get("samples") or "–"), metric,
                          _pm(value.get("before"), value.get("stderr_before")),
                          _pm(value.get("after"), value.get("stderr_after")),
                          _pm(value.get("difference"), value.get("stderr"), signed=True))
    return table


@contextmanager
def completions_server(settings: Any, manager: Any) -> Iterator[tuple[str, Any]]:
    """Serve /v1/completions and /v1/chat/completions (and /v1/models) on 127.0.0.1 at a free port; yields (base
    URL, the pool)."""
    import uvicorn
    from fastapi import Depends, FastAPI

    from tunestudio.api import errors
    from tunestudio.api.deps import require_token
    from tunestudio.api.routes import completions, openai
    from tunestudio.inference import InferencePool
    from tunestudio.jobs import inference_executor

    app = FastAPI(title="tunestudio bench")
    app.state.settings, app.state.manager = settings, manager
    app.state.inference = InferencePool(settings, inference_executor)
    errors.install(app)
    app.include_router(completions.router, dependencies=[Depends(require_token)])
    app.include_router(openai.router, dependencies=[Depends(require_token)])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, name="bench-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + SERVER_START_S
    while thread.is_alive() and not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        if not server.started:
            raise RuntimeError("the completions server did not start")
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}", app.state.inference
    finally:
        server.should_exit = True
        thread.join(30)
        app.state.inference.close()


def bench(
    job_id: Annotated[str, typer.Argument(help="The finished job to benchmark (against its base model).")],
    tasks: Annotated[str, typer.Option(help="lm-evaluation-harness tasks, comma-separated (their data must be in "
                                            "the local HF datasets cache).")] = "",
    eval_file: Annotated[Path | None, typer.Option(help="Your own rows as a task: JSON lines of {question, choices, "
                                                        "answer} or {question, answer}.")] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="At most this many rows per task.")] = None,
    chat_template: Annotated[bool | None, typer.Option("--chat-template/--no-chat-template", help=(
        "Wrap prompts in the job's chat template (default: when its tokenizer has one)."))] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the figures as one JSON object.")] = False,
) -> None:
    """Run lm-evaluation-harness on a job and its base model: per task and metric, before, after, difference."""
    import json

    from tunestudio.jobs import JobStatus

    options = _options(tasks, eval_file, limit, chat_template)
    final = _run(job_id, options)
    if final.status is not JobStatus.completed:
        err.print(f"[red]benchmark {final.status.value}: {final.error or final.message}[/red]", soft_wrap=True)
        raise typer.Exit(1)
    result = (final.result or {}).get("benchmarks") or {}
    if json_out:
        print(json.dumps(result, indent=2))
    else:
        console.print(results_table(result))


def _options(tasks: str, eval_file: Path | None, limit: int | None, chat_template: bool | None) -> BenchOptions:
    """The command's options as the benchmark's, or exit 2 naming the field that is wrong."""
    from tunestudio.bench_config import BenchOptions
    from tunestudio.config import format_validation_error

    try:
        return BenchOptions(tasks=[t.strip() for t in tasks.split(",") if t.strip()],
                            eval_file=str(eval_file) if eval_file else None, limit=limit, chat_template=chat_template)
    except ValidationError as exc:
        for item in format_validation_error(exc):
            err.print(f"[red]{item['field']}: {item['message']}[/red]")
        raise typer.Exit(2) from None


def _run(job_id: str, options: BenchOptions) -> Job:
    """The benchmark job, submitted with this process's completions server for its worker to call, followed to
    its end; exit 2 for a job or model that cannot be benchmarked."""
    from tunestudio.api.benchmarks import bench_config
    from tunestudio.bench_tasks import UnknownTasks, check_tasks
    from tunestudio.inference import UnknownModel
    from tunestudio.jobs import JobConflict, JobManager, JobNotFound, QueueFull
    from tunestudio.paths import PathRefused
    from tunestudio.settings import Settings

    settings = Settings()
    try:  # known once a benchmark indexed the harness; checked before the manager warms a worker (the manager
        check_tasks(options.tasks, settings.cache_dir(), options.eval_file)  # checks it again)
    except UnknownTasks as exc:
        for message in exc.messages:
            err.print(f"[red]tasks: {message}[/red]", soft_wrap=True)
        raise typer.Exit(2) from None
    token = settings.api_token.get_secret_value() if settings.api_token is not None else None
    with JobManager(settings, adopt_queued=False) as manager, completions_server(settings, manager) as (url, _):
        try:
            config = bench_config(manager, job_id, options, url, token)
            job = manager.benchmark(config)
        except (JobNotFound, JobConflict, PathRefused, QueueFull, UnknownModel, UnknownTasks) as exc:
            err.print(f"[red]{exc}[/red]")
            raise typer.Exit(2) from None
        console.print(f"benchmark [bold]{job.id}[/bold] of job {job_id}: {', '.join(config.tasks) or ''}"
                      f"{' + ' if config.tasks and config.eval_file else ''}{config.eval_file or ''}")
        console.print(f"worker log: {job.log_path}")
        _watch(manager, job.id)
        return manager.get(job.id)


def _watch(manager: JobManager, job_id: str) -> None:
    """Print the job's status, phases and logs until it ends; Ctrl-C cancels it."""
    from tunestudio.events import Log, Phase, StatusEvent, WarningEvent, parse_stream_event
    from tunestudio.jobs import JobConflict

    cancelled = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: cancelled.set())  # the handler records; the loop acts
    try:
        with manager.subscribe(job_id) as stream:
            while True:
                if cancelled.is_set():
                    cancelled.clear()
                    console.print("[red]cancelling[/]")
                    with contextlib.suppress(JobConflict):
                        manager.cancel(job_id)
                item = stream.get(timeout=0.2)
                if item is None:
                    continue
                event = parse_stream_event(item.data)
                if isinstance(event, StatusEvent):
                    console.print(f"[dim]{event.status}[/dim]")
                elif isinstance(event, Phase):
                    console.print(f"{event.phase.replace('_', ' ')}: {event.message}")
                elif isinstance(event, (Log, WarningEvent)):
                    console.print(f"[dim]{event.message}[/dim]")
                if item.is_end:
                    break
    finally:
        signal.signal(signal.SIGINT, previous)
