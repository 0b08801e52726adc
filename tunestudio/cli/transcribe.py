"""`tunestudio transcribe JOB FILE [--base] [--language L] [--prompt TEXT] [--format text|json|verbose_json|srt|vtt]`:
a recording transcribed by a speech-to-text job's model (or its base), in an inference worker process, as
`/v1/audio/transcriptions` does it: cut into the model's windows, a segment each. This process never imports torch.
"""

from __future__ import annotations

import queue
from pathlib import Path
from typing import Annotated

import typer

from tunestudio.cli.common import err
from tunestudio.transcripts import FORMATS, render

WAIT_S = 600.0


def transcribe(
    job_id: Annotated[str, typer.Argument(help="A speech-to-text job (is_dataset_audio).")],
    file: Annotated[Path, typer.Argument(help="The recording: WAV, FLAC, MP3 or OGG.")],
    base: Annotated[bool, typer.Option("--base", help="The job's base model instead.")] = False,
    language: Annotated[str | None, typer.Option(help="The spoken language (default: the job's).")] = None,
    prompt: Annotated[str | None, typer.Option(help="Words to prime the decoder with (names, jargon).")] = None,
    temperature: Annotated[float, typer.Option(min=0.0, max=1.0, help="0: greedy.")] = 0.0,
    output_format: Annotated[str, typer.Option("--format", help=f"One of {', '.join(FORMATS)}.")] = "text",
) -> None:
    """Transcribe a recording with a speech-to-text job's model."""
    from tunestudio.inference import InferencePool, UnknownModel, resolve
    from tunestudio.inference_protocol import Done, Error, Transcribed
    from tunestudio.jobs import JobManager, inference_executor
    from tunestudio.settings import Settings

    if output_format not in FORMATS:
        err.print(f"[red]--format: {output_format!r} is not one of {', '.join(FORMATS)}[/red]")
        raise typer.Exit(2)
    try:
        audio = file.expanduser().read_bytes()
    except OSError as exc:
        err.print(f"[red]{file}: {exc.strerror or exc}[/red]")
        raise typer.Exit(2) from None
    settings = Settings()
    manager = JobManager(settings)
    try:
        spec = resolve(manager, f"{job_id}:base" if base else job_id)
    except UnknownModel as exc:
        err.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    finally:
        manager.close()
    if spec.modality != "audio":
        err.print(f"[red]{job_id} is a {spec.modality} job; transcribe needs a speech-to-text job "
                  "(is_dataset_audio)[/red]")
        raise typer.Exit(2)
    if len(audio) > settings.max_audio_bytes:
        err.print(f"[red]{file}: {len(audio):,} bytes, over the {settings.max_audio_bytes:,} a transcription takes "
                  "(TUNESTUDIO_MAX_AUDIO_BYTES)[/red]")
        raise typer.Exit(2)
    pool = InferencePool(settings, inference_executor)
    replies: queue.SimpleQueue = queue.SimpleQueue()
    try:
        pool.transcribe(spec, audio, deliver=replies.put, language=language, prompt=prompt, temperature=temperature)
        done = None
        while True:
            try:
                reply = replies.get(timeout=WAIT_S)
            except queue.Empty:
                err.print(f"[red]the inference worker said nothing for {WAIT_S:g} s[/red]")
                raise typer.Exit(1) from None
            if isinstance(reply, Transcribed):
                done = reply
            elif isinstance(reply, Error):
                err.print(f"[red]{reply.message}[/red]", soft_wrap=True)
                raise typer.Exit(1)
            elif isinstance(reply, Done):
                break
    finally:
        pool.close()
    if done is None:
        err.print("[red]the transcription was cancelled[/red]")
        raise typer.Exit(1)
    print(render(output_format, done.text, done.language, done.duration, done.segments), end="")
