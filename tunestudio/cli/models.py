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
    vision: Annotated[bool, typer.Option("--vision", help="A tiny vision-language model instead, with its real "
                                         "processor (images: examples/data/shapes.jsonl).")] = False,
    family: Annotated[str, typer.Option(help="With --vision: smolvlm (Idefics3's architecture) or qwen2_vl.")]
    = "smolvlm",
    audio: Annotated[bool, typer.Option("--audio", help="A tiny speech-to-text model instead (Whisper's "
                                        "architecture, its real processor; speech: examples/data/speech/).")] = False,
) -> None:
    """Build the embedded tiny Llama and its byte-level tokenizer, with --vision a tiny vision-language model, or
    with --audio a tiny Whisper (deterministic from the seed)."""
    # Runs in a child so this process stays free of torch, like every other command.
    import multiprocessing as mp

    started = time.monotonic()
    ctx = mp.get_context("spawn")
    if vision and family not in ("smolvlm", "qwen2_vl"):
        err.print(f"[red]--family: {family!r} is not one of smolvlm, qwen2_vl[/red]")
        raise typer.Exit(2)
    if vision and audio:
        err.print("[red]--audio: give --vision or --audio, not both[/red]")
        raise typer.Exit(2)
    proc = ctx.Process(target=_build_tiny, args=(str(directory), seed, family if vision else None, audio))
    proc.start()
    proc.join()
    if proc.exitcode != 0:
        err.print(f"[red]building the tiny model failed (exit code {proc.exitcode})[/red]")
        raise typer.Exit(1)
    console.print(f"tiny model written to {directory} in {time.monotonic() - started:.1f}s")


def _build_tiny(directory: str, seed: int, vision_family: str | None, audio: bool = False) -> None:
    if audio:
        from tunestudio.worker.tiny_audio import build_tiny_whisper

        build_tiny_whisper(directory, seed)
        return
    if vision_family is not None:
        from tunestudio.worker.tiny_vision import build_tiny_vlm

        build_tiny_vlm(directory, vision_family, seed)
        return
    from tunestudio.worker.tiny import build_tiny_model

    build_tiny_model(directory, seed)


def make_dataset(
    directory: Annotated[Path, typer.Argument(help="Folder to write the bundled dataset to.")] = Path("examples/data"),
) -> None:
    """Write the bundled dataset (alpaca, sharegpt, messages, prompt/completion and text forms; preference pairs,
    unpaired feedback and prompts with answers for DPO/ORPO, KTO and GRPO; lookup pairs for reward models; tool
    calls, with held-out rows; coloured shapes with their pictures, for the tiny vision models)."""
    from tunestudio.worker.tiny import write_dataset
    from tunestudio.worker.tiny_images import write_image_datasets
    from tunestudio.worker.tiny_methods import write_method_datasets
    from tunestudio.worker.tiny_rewards import write_reward_datasets
    from tunestudio.worker.tiny_tools import write_tool_datasets

    for path in [*write_dataset(directory), *write_method_datasets(directory), *write_tool_datasets(directory),
                 *write_image_datasets(directory), *write_reward_datasets(directory)]:
        console.print(str(path))
