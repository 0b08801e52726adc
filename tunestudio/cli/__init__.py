"""The command line: one module per verb, registered here on `app` (pyproject's `tunestudio` entry point).

    train.py   `train JOB.yaml`              export.py  `export JOB_ID --to TARGET`
    jobs.py    `jobs list|show|rows|stop|resume`
    chat.py    `chat JOB_ID`                 sweep.py   `sweep SWEEP.yaml`
    bench.py   `bench JOB_ID --tasks ...`    judge.py   `judge JOB_ID`
    data.py    `data inspect FILE…`          serve.py   `serve`
    make_data.py  `data make RECIPE.yaml [--preview N]`: documents and a teacher write a dataset
    models.py  `make-tiny-model DIR`, `make-dataset [DIR]`
    follow.py  a foreground job's live view and summary (train, export, jobs resume)
    common.py  the consoles, the settings and the manager (or one line and exit 2), small formats

The CLI is the parent side: it never imports torch or the HF libraries itself; training runs in a supervised
worker process (tests/test_one_rule.py).
"""

from __future__ import annotations

import typer

from tunestudio.cli import (
    arena,
    bench,
    chat,
    data,
    export,
    jobs,
    judge,
    make_data,
    models,
    serve,
    sweep,
    train,
    transcribe,
)

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Fine-tune language models on your own machine.")

# The help lists the commands in this order, then the groups.
app.command()(train.train)
app.command()(chat.chat)
app.command()(sweep.sweep)
app.command()(bench.bench)
app.command()(judge.judge)
app.command()(transcribe.transcribe)
app.command()(export.export)
app.command()(serve.serve)
app.command("make-tiny-model")(models.make_tiny_model)
app.command("make-dataset")(models.make_dataset)
app.add_typer(jobs.jobs_app, name="jobs")
app.add_typer(arena.arena_app, name="arena")  # the arena's votes: export, list, rank
data.data_app.command("make")(make_data.make)  # data make: a recipe run as a job of kind make_data
app.add_typer(data.data_app, name="data")  # data inspect: the dataset report (tunestudio/data_report/)

__all__ = ["app"]
