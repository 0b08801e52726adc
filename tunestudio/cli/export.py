"""`tunestudio export JOB_ID --to merged|gguf|gguf-lora|hub`: a finished job's export, in the foreground (an
export is a job of the queue, followed as a training is: cli/follow.py). Ctrl-C stops it and keeps nothing."""

from __future__ import annotations

import os
from enum import StrEnum
from typing import Annotated

import typer
from pydantic import ValidationError

from tunestudio.cli.common import err, own_manager
from tunestudio.cli.follow import follow
from tunestudio.config import format_validation_error
from tunestudio.export_config import ExportOptions
from tunestudio.jobs import JobConflict, JobNotFound, JobStatus, QueueFull
from tunestudio.paths import PathRefused


class ExportTargetOption(StrEnum):
    merged = "merged"
    gguf = "gguf"
    gguf_lora = "gguf-lora"
    hub = "hub"


class ExportDtypeOption(StrEnum):
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


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
    with own_manager() as manager:
        try:
            job = manager.export(job_id, options)
        except (JobNotFound, JobConflict, PathRefused, QueueFull) as exc:
            err.print(f"[red]{exc}[/red]")
            raise typer.Exit(2) from None
        final = follow(manager, job.id)
    if final.status is JobStatus.failed:
        raise typer.Exit(1)
