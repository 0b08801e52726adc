"""`tunestudio chat JOB_ID [--base|--compare] [--step N] [--system TEXT] [--image FILE]`. In the chat, `/prompt`
prints the prompt the model saw for the last message (its chat template applied, rendered by the inference worker).
`--image` shows an image job's model a picture with the conversation's first message (the worker decodes it).

The chat runs the job's model in an inference worker process (tunestudio/inference/);
this process, like every CLI process, never imports torch.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tunestudio.cli.common import console, err

if TYPE_CHECKING:
    from tunestudio.inference import GenerateParams, InferencePool, ModelSpec
    from tunestudio.inference_protocol import ImageInput
    from tunestudio.settings import Settings


class _Interrupted:
    """Ctrl-C while a reply streams stops that reply; at the prompt it ends the chat."""

    def __init__(self) -> None:
        self.generation: Any = None
        self.hit = False

    def __call__(self, signum: int, frame: object) -> None:
        self.hit = True
        if self.generation is not None:
            self.generation.cancel()
        else:
            raise KeyboardInterrupt


def chat(
    job_id: Annotated[str, typer.Argument(help="A finished, stopped or interrupted (with a checkpoint) job.")],
    base: Annotated[bool, typer.Option("--base", help="Talk to the job's base model instead.")] = False,
    compare: Annotated[bool, typer.Option("--compare", help="Print the base model's and the job's answer.")] = False,
    temperature: Annotated[float, typer.Option(min=0.0, max=2.0, help="0: greedy.")] = 0.0,
    top_p: Annotated[float, typer.Option(min=0.0, max=1.0)] = 1.0,
    max_tokens: Annotated[int, typer.Option(min=1, help="The longest reply.")] = 256,
    seed: Annotated[int | None, typer.Option(help="Seed for sampling.")] = None,
    system: Annotated[str | None, typer.Option(help="A system message to start the conversation with.")] = None,
    step: Annotated[int | None, typer.Option(min=0, help="Talk to the job's saved checkpoint-N (its weights at "
                                                          "step N) instead of its final weights.")] = None,
    image: Annotated[list[Path] | None, typer.Option(
        "--image", metavar="FILE", help="An image to show the model with your first message (an image job's "
                                        "model; repeat the option for more).")] = None,
) -> None:
    """Chat with a job's result in the terminal, with streaming replies. Ctrl-C stops a reply; Ctrl-D ends."""
    from tunestudio.inference import InferencePool
    from tunestudio.inference_protocol import GenerateParams
    from tunestudio.jobs import inference_executor
    from tunestudio.settings import Settings

    if base and (compare or step is not None):
        err.print(f"[red]--base and {'--compare' if compare else '--step'} exclude each other[/red]")
        raise typer.Exit(2)
    settings = Settings()
    sides = _sides(settings, job_id, base, compare, step)
    images = _images(image or [], sides)
    pool = InferencePool(settings, inference_executor)
    params = GenerateParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed)
    interrupted = _Interrupted()
    previous = signal.signal(signal.SIGINT, interrupted)
    names = ", ".join("base model" if s.base else f"job {s.job_id}" + (f" at step {step}" if step is not None else "")
                      for s in sides)
    console.print(f"chatting with {names}; Ctrl-C stops a reply, Ctrl-D (or /exit) ends, /reset forgets, /prompt "
                  "shows the last prompt as the model saw it; end a line with \\ to go on on the next")
    try:
        _converse(pool, sides, params, system, interrupted, images)
    finally:
        signal.signal(signal.SIGINT, previous)
        pool.close()


def _sides(settings: Settings, job_id: str, base: bool, compare: bool, step: int | None) -> list[ModelSpec]:
    """The models that answer, in order: the job's (at step N), or its base, or the base then the job; exit 2
    naming one that cannot be talked to."""
    from tunestudio.inference import UnknownModel, resolve
    from tunestudio.jobs import JobManager

    model = job_id if step is None else f"{job_id}:step-{step}"
    manager = JobManager(settings)
    try:
        try:
            sides = [resolve(manager, f"{job_id}:base")] if base else [resolve(manager, model)]
            if compare:
                sides.insert(0, resolve(manager, f"{job_id}:base"))
        except UnknownModel as exc:
            err.print(f"[red]{exc}[/red]")
            raise typer.Exit(2) from None
    finally:
        manager.close()
    return sides


def _images(files: list[Path], sides: list[ModelSpec]) -> tuple[ImageInput, ...]:
    """The --image files' bytes (Pillow reads them in the worker); exit 2 for a text model or an unreadable file."""
    from tunestudio.inference_protocol import ImageInput

    if files and (text := next((s for s in sides if s.modality != "image"), None)) is not None:
        err.print(f"[red]--image: {text.model_id} is a {text.modality} model and reads no images; chat with an "
                  "image job (is_dataset_image)[/red]")
        raise typer.Exit(2)
    images = []
    for file in files:
        try:
            images.append(ImageInput(f"--image {file}", file.expanduser().read_bytes()))
        except OSError as exc:
            err.print(f"[red]--image: cannot read {file}: {exc.strerror or exc}[/red]")
            raise typer.Exit(2) from None
    return tuple(images)


def _user_turn(history: list[dict[str, Any]], prompt: str, images: tuple[ImageInput, ...]) -> dict[str, Any]:
    """The user's turn; the conversation's first holds the images' placeholders, before the text."""
    if not images or any(turn["role"] == "user" for turn in history):
        return {"role": "user", "content": prompt}
    return {"role": "user", "content": [*({"type": "image"} for _ in images), {"type": "text", "text": prompt}]}


def _converse(pool: InferencePool, sides: list[ModelSpec], params: GenerateParams, system: str | None,
              interrupted: _Interrupted, images: tuple[ImageInput, ...] = ()) -> None:
    """Read a prompt, let each side answer it, until Ctrl-D, Ctrl-C at the prompt or /exit; /reset and /prompt
    act on the conversation. The images go with every request: the first user turn holds them."""
    histories: list[list[dict[str, Any]]] = [[{"role": "system", "content": system}] if system else []
                                             for _ in sides]
    sent: list[dict[str, Any]] = []  # the last messages the last side was given
    while True:
        try:
            prompt = _read("\n[bold]you[/] › ")
        except (EOFError, KeyboardInterrupt):
            break
        if prompt.strip() in ("/exit", "/quit"):
            break
        if prompt.strip() == "/reset":
            histories = [h[:1] if system else [] for h in histories]
            console.print("[dim]conversation forgotten[/dim]")
            continue
        if prompt.strip() == "/prompt":
            _show_prompt(pool, sides[-1], sent, images)
            continue
        if not prompt.strip():
            continue
        for spec, history in zip(sides, histories, strict=True):
            history.append(_user_turn(history, prompt, images))
            sent = list(history)
            _answer(pool, spec, history, params, interrupted, images)


def _answer(pool: InferencePool, spec: ModelSpec, history: list[dict[str, Any]], params: GenerateParams,
            interrupted: _Interrupted, images: tuple[ImageInput, ...] = ()) -> None:
    """One side's reply to the history, streamed to the terminal and added to it; a refused turn taken back."""
    from tunestudio.inference import InferenceUnavailable

    label = "base model" if spec.base else "fine-tuned"
    console.print(f"[bold]{label}[/] › ", end="")
    interrupted.hit = False
    try:
        generation = pool.generate(spec, history, params, images=images)
        interrupted.generation = generation
        text = "".join(_stream(generation))
        done = generation.result()
    except InferenceUnavailable as exc:
        console.print()
        err.print(f"[red]{exc}[/red]")
        history.pop()
        return
    finally:
        interrupted.generation = None
    cut = ", cut at max_tokens" if done.finish_reason == "length" else ""
    console.print("[dim] (stopped)[/dim]" if interrupted.hit or done.finish_reason == "cancelled"
                  else f"[dim]  ({done.completion_tokens} tokens{cut})[/dim]")
    history.append({"role": "assistant", "content": text})


def _show_prompt(pool: Any, spec: Any, messages: list[dict[str, Any]], images: tuple[ImageInput, ...] = ()) -> None:
    """Print the prompt these messages gave the model: the inference worker renders it (nothing generated)."""
    from tunestudio.inference import InferenceUnavailable

    if not messages:
        console.print("[dim]no message yet[/dim]")
        return
    render = pool.render(spec, messages, images=images)
    try:
        for _ in render:  # a render sends no text: this waits for its end
            pass
    except InferenceUnavailable as exc:
        err.print(f"[red]{exc}[/red]")
        return
    shown = render.rendered
    if shown is None:
        err.print("[red]the inference worker answered without the prompt[/red]")
        return
    console.print(f"[dim]the prompt the model read ({shown.prompt_tokens} tokens):[/dim]")
    sys.stdout.write(shown.prompt + "\n")  # as it is: no wrapping, no markup
    sys.stdout.flush()


def _read(prompt: str) -> str:
    """One prompt; a line that ends with a backslash goes on on the next line (prompts may hold line breaks)."""
    console.print(prompt, end="")
    lines: list[str] = []
    while True:
        line = sys.stdin.readline()
        if not sys.stdin.isatty():
            console.print()  # piped input is not echoed: the reply starts on a line of its own
        if not line:
            if lines:
                return "\n".join(lines)
            raise EOFError
        line = line.rstrip("\n")
        if not line.endswith("\\"):
            return "\n".join([*lines, line])
        lines.append(line[:-1])


def _stream(generation: Any) -> Any:
    for delta in generation:
        sys.stdout.write(delta)
        sys.stdout.flush()
        yield delta
