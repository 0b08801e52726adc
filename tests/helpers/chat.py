"""A short real LoRA job to chat with, trained once per session, and what a chat test module needs of it."""

from __future__ import annotations

import itertools
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunestudio.inference import InferenceUnavailable
from tunestudio.inference_protocol import Delta, Done, Started, Tools
from tunestudio.jobs.manager import JobManager
from tunestudio.jobs.models import Job
from tunestudio.jobs.status import JobStatus
from tunestudio.settings import Settings

from .jobs import job_config
from .wait import wait_until

PROMPT = "What sound does this animal make?\n\ncow"
_used = itertools.count(1)


def train_chat_job(tiny_model: Path, home: Path, **overrides: Any) -> Job:
    """A completed 40-step LoRA job of the tiny model, with an eval split, samples and an evaluation."""
    settings = Settings(home=home)
    fields = {"max_steps": 40, "eval_steps": 0.5, "eval_generate_rows": 8, "sample_prompts": [PROMPT], **overrides}
    cfg = job_config(tiny_model, Path(fields.pop("output_dir", home / "chat-job")), **fields)
    with JobManager(settings) as manager:
        job = manager.submit(cfg)
        job = wait_until(lambda: j if (j := manager.get(job.id)).status.is_terminal else None, 600,
                         "the chat job's end")
    assert job.status is JobStatus.completed, f"the chat job ended {job.status.value}: {job.error}"
    return job


@dataclass(frozen=True)
class ChatHome:
    """The session's chat job (`train_chat_job`) and the data directory it lives in, its output folder inside.

    The chat test modules share it (tests/conftest.py: `chat_home`), and a module may change what it finds there
    (export the job, run another job into its folder, train more jobs beside it), so each module starts from the
    data directory as the training left it: `fresh()` puts back a copy of it at the same path, so the absolute
    paths in its store (the job's output folder, its log) hold.
    """

    home: Path
    job: Job
    pristine: Path  # the data directory right after training

    @classmethod
    def trained(cls, tiny_model: Path, folder: Path) -> ChatHome:
        home = folder / "home"
        job = train_chat_job(tiny_model, home)
        shutil.copytree(home, folder / "pristine", symlinks=True)  # the manager is closed: its store is at rest
        return cls(home, job, folder / "pristine")

    def fresh(self) -> ChatHome:
        """The data directory as the training left it, at its path; what the last module left is put aside."""
        if self.home.exists():
            # Renamed first: a straggler of the last module (a dying worker's log line) cannot break the copy.
            used = self.home.rename(self.home.with_name(f"{self.home.name}-used-{next(_used)}"))
            shutil.rmtree(used, ignore_errors=True)
        shutil.copytree(self.pristine, self.home, symlinks=True)
        return self


def add_saved_step(job: Job, step: int) -> str:
    """A `checkpoint-<step>` folder in the job's output, as a save during training leaves one: its final adapter
    and tokenizer files copied with their times kept (so they are no newer than the job's end). Its model id."""
    out = Path(job.output_dir or "")
    folder = out / f"checkpoint-{step}"
    folder.mkdir(exist_ok=True)
    for name in ("adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "chat_template.jinja"):
        if (out / name).is_file():
            shutil.copy2(out / name, folder / name)
    return f"{job.id}:step-{step}"


class _Written:
    """A scripted answer: what the route reads of a Generation."""

    def __init__(self, started: Started) -> None:
        self.started = started

    def cancel(self) -> None:
        pass


class ScriptedPool:
    """An inference pool (`tunestudio.api.InferencePool` patched) whose model 'writes' the next of `outputs` (the
    last one again when they run out) in pieces of 5 characters, after the call opener the request's tool_choice
    asks for: what a model that calls in the Hermes/Qwen layout writes. It thinks (Started.think). `requests`:
    each request's (messages, tools) as the worker got them."""

    def __init__(self, outputs: list[str]) -> None:
        self.outputs = outputs
        self.requests: list[tuple[list[dict[str, Any]], Tools | None]] = []

    def generate(self, spec: Any, messages: Any, params: Any, deliver: Any, tools: Tools | None = None,
                 images: Any = ()) -> _Written:
        from tunestudio.tool_calls import Hermes

        self.requests.append((messages, tools))
        output = self.outputs[min(len(self.requests), len(self.outputs)) - 1]
        opener = Hermes().opener(None if tools.choice == "required" else tools.choice) \
            if tools and tools.choice != "auto" else ""
        written = _Written(Started(1, 3, family="hermes" if tools else None, think=True, prefix=opener))
        text = output.removeprefix(opener)

        def play() -> None:
            deliver(written.started)
            for i in range(0, len(text), 5):
                deliver(Delta(1, text[i:i + 5]))
            deliver(Done(1, "stop", 3, len(text)))

        threading.Thread(target=play, daemon=True).start()
        return written

    def render(self, *args: Any, **kwargs: Any) -> Any:
        raise InferenceUnavailable("a scripted pool renders no prompt")

    def status(self) -> dict[str, Any]:
        return {"state": "running"}

    def close(self) -> None:
        pass
