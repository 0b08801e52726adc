"""`tunestudio data make RECIPE.yaml [--preview N]`: documents (or seed prompts) and a teacher model write a dataset
(issue 43). The recipe runs as a job of kind make_data, in the foreground with the same live view and exit codes
as `train` (cli/follow.py): 0 made (or stopped), 1 failed, 2 a recipe refused before anything ran. `--preview N`
makes the first N rows in a child process (documents are never read in this one) and prints them, writing
nothing. The teacher's key is read from the variable `teacher.api_key_env` names, here, and never written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from pydantic import ValidationError
from rich.markup import escape

from tunestudio.cli.common import console, err, own_manager
from tunestudio.cli.follow import follow
from tunestudio.config import format_validation_error
from tunestudio.jobs import JobConflict, JobStatus, QueueFull
from tunestudio.make_data_config import MakeDataConfig, resolve, with_key
from tunestudio.paths import PathRefused

PREVIEW_SLACK_S = 60.0  # the preview child's bound beyond the teacher's own deadlines


def make(
    recipe: Annotated[Path, typer.Argument(help="A YAML or JSON data-making recipe.")],
    preview: Annotated[int | None, typer.Option(help="Make the first N rows and print them; write nothing.")] = None,
) -> None:
    """Make a dataset from documents (or seed prompts) with a teacher model; Ctrl-C once: stop, twice: cancel."""
    cfg = _load(recipe)
    if preview is not None:
        _preview(cfg, preview)
        return
    with own_manager() as manager:
        try:
            job = manager.make_data(cfg)
        except (PathRefused, QueueFull, JobConflict) as exc:
            err.print(f"[red]{escape(str(exc))}[/red]")
            raise typer.Exit(2) from None
        final = follow(manager, job.id)
    if final.status is JobStatus.failed:
        raise typer.Exit(1)


def _load(path: Path) -> MakeDataConfig:
    """The recipe validated, its paths resolved and its key read, or the reasons and exit 2."""
    try:
        raw: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
        if not isinstance(raw, dict):
            raise ValueError("a recipe is a mapping of fields")
        return with_key(resolve(MakeDataConfig.model_validate(raw)))
    except ValidationError as exc:
        for error in format_validation_error(exc):
            err.print(f"[red]{escape(error['field'] or 'recipe')}: {escape(error['message'])}[/red]")
    except (OSError, ValueError, yaml.YAMLError) as exc:  # PathRefused is a ValueError
        err.print(f"[red]{escape(str(path))}: {escape(str(exc))}[/red]")
    raise typer.Exit(2)


def _preview(cfg: MakeDataConfig, rows: int) -> None:
    given = json.dumps({"public": cfg.public_dict(), "secrets": cfg.secrets(), "rows": rows})
    bound = cfg.timeout * (rows + 1) + PREVIEW_SLACK_S
    try:
        done = subprocess.run([sys.executable, "-m", "tunestudio.worker.make_data"], input=given, text=True,
                              capture_output=True, timeout=bound, check=False)
    except subprocess.TimeoutExpired:
        err.print(f"[red]the preview took longer than {bound:.0f} s[/red]")
        raise typer.Exit(1) from None
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        err.print(f"[red]the preview failed: {escape(done.stderr.strip()[-2000:])}[/red]")
        raise typer.Exit(1) from None
    if "error" in answer:
        err.print(f"[red]{escape(answer['error'])}[/red]")
        raise typer.Exit(1)
    for row in answer["rows"]:
        if "removed_by" in row:
            console.print(f"[yellow]removed by {row['removed_by']}[/yellow] ({escape(row['why'])}): "
                          f"{escape(row['text'][:300])!r}")
            continue
        console.print(f"[dim]{escape(row['provenance']['key'])}[/dim]")
        for turn in row["messages"]:
            console.print(f"[bold]{turn['role']}[/bold]  {escape(turn['content'])}")
        console.print()
