"""`tunestudio data make RECIPE.yaml [--preview N]`: documents (or seed prompts) and a teacher model write a dataset
(issue 43). The recipe runs as a job of kind make_data, in the foreground with the same live view and exit codes
as `train` (cli/follow.py): 0 made (or stopped), 1 failed, 2 a recipe refused before anything ran. `--preview N`
makes the first N rows in a child process (documents are never read in this one) and prints them, writing
nothing. The teacher's key is read from the variable `teacher.api_key_env` names, here, and never written."""

from __future__ import annotations

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
from tunestudio.make_data_preview import PreviewFailed, make_preview
from tunestudio.paths import PathRefused


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
    try:
        answer = make_preview(cfg, rows)
    except PreviewFailed as exc:
        err.print(f"[red]{escape(str(exc))}[/red]")
        raise typer.Exit(1) from None
    for row in answer["removed"]:
        console.print(f"[yellow]removed by {row['removed_by']}[/yellow] ({escape(row['why'])}): "
                      f"{escape(row['text'][:300])!r}")
    for row in answer["rows"]:
        console.print(f"[dim]{escape(row['provenance']['key'])}[/dim]")
        for turn in row["messages"]:
            console.print(f"[bold]{turn['role']}[/bold]  {escape(turn['content'])}")
        console.print()
