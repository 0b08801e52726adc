"""`tunestudio chat JOB_ID [--base|--compare] [--step N] [--system TEXT]`. In the chat, `/prompt` prints the
prompt the model saw for the last message (its chat template applied, rendered by the inference worker).

The chat runs the job's model in an inference worker process (tunestudio/inference/);
this process, like every CLI process, never imports torch.
"""

from __future__ import annotations

import signal
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tunestudio.cli.common import console, err

if TYPE_CHECKING:
    from tunestudio.inference import GenerateParams, InferencePool, ModelSpec
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
    pool = InferencePool(settings, inference_executor)
    params = GenerateParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed)
    interrupted = _Interrupted()
    previous = signal.signal(signal.SIGINT, interrupted)
    names = ", ".join("base model" if s.base else f"job {s.job_id}" + (f" at step {step}" if step is not None else "")
                      for s in sides)
    console.print(f"chatting with {names}; Ctrl-C stops a reply, Ctrl-D (or /exit) ends, /reset forgets, /prompt "
                  "shows the last prompt as the model saw it; end a line with \\ to go on on the next")
    try:
        _converse(pool, sides, params, system, interrupted)
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


def _converse(pool: InferencePool, sides: list[ModelSpec], params: GenerateParams, system: str | None,
              interrupted: _Interrupted) -> None:
    """Read a prompt, let each side answer it, until Ctrl-D, Ctrl-C at the prompt or /exit; /reset and /prompt
    act on the conversation."""
    histories: list[list[dict[str, str]]] = [[{"role": "system", "content": system}] if system else []
                                             for _ in sides]
    sent: list[dict[str, str]] = []  # the last messages the last side was given
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
            _show_prompt(pool, sides[-1], sent)
            continue
        if not prompt.strip():
            continue
        for spec, history in zip(sides, histories, strict=True):
            history.append({"role": "user", "content": prompt})
            sent = list(history)
            _answer(pool, spec, history, params, interrupted)


def _answer(pool: InferencePool, spec: ModelSpec, history: list[dict[str, str]], params: GenerateParams,
            interrupted: _Interrupted) -> None:
    """One side's reply to the history, streamed to the terminal and added to it; a refused turn taken back."""
    from tunestudio.inference import InferenceUnavailable

    label = "base model" if spec.base else "fine-tuned"
    console.print(f"[bold]{label}[/] › ", end="")
    interrupted.hit = False
    try:
        generation = pool.generate(spec, history, params)
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


def _show_prompt(pool: Any, spec: Any, messages: list[dict[str, str]]) -> None:
    """Print the prompt these messages gave the model: the inference worker renders it (nothing generated)."""
    from tunestudio.inference import InferenceUnavailable

    if not messages:
        console.print("[dim]no message yet[/dim]")
        return
    render = pool.render(spec, messages)
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
