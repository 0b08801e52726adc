"""`tunestudio make-tiny-model DIR` and `tunestudio make-dataset [DIR]`: the embedded tiny Llama and the bundled
dataset, for a first run with nothing downloaded. The worker's code writes them; the model in a spawned child, so
this process stays free of torch."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from tunestudio.cli.common import console, err


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


def make_dataset(
    directory: Annotated[Path, typer.Argument(help="Folder to write the bundled dataset to.")] = Path("examples/data"),
) -> None:
    """Write the bundled dataset (alpaca, sharegpt, messages, prompt/completion and text forms; preference pairs,
    unpaired feedback and prompts with answers for DPO/ORPO, KTO and GRPO; tool calls, with held-out rows)."""
    from tunestudio.worker.tiny import write_dataset
    from tunestudio.worker.tiny_methods import write_method_datasets
    from tunestudio.worker.tiny_tools import write_tool_datasets

    for path in [*write_dataset(directory), *write_method_datasets(directory), *write_tool_datasets(directory)]:
        console.print(str(path))
