"""Factories for job configs and a synchronous way to run a real worker to its end."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunestudio.config import JobConfig
from tunestudio.events import Completed, Event, Failed, Log, Progress, WarningEvent
from tunestudio.jobs.supervisor import Outcome, Supervisor

DATA = Path(__file__).resolve().parents[2] / "examples" / "data"


def job_config(model: Path | str, output_dir: Path, **overrides: Any) -> JobConfig:
    """A short, fast job on the bundled alpaca data."""
    base: dict[str, Any] = {
        "model_name": str(model),
        "local_datasets": [str(DATA / "alpaca.jsonl")],
        "output_dir": str(output_dir),
        "training_type": "lora",
        "max_steps": 30,
        "batch_size": 8,
        "gradient_accumulation_steps": 1,
        "learning_rate": 3e-3,
        "lora_r": 16,
        "lora_alpha": 32,
        "max_seq_length": 128,
        "logging_steps": 1,
        "random_seed": 7,
    }
    base.update(overrides)
    return JobConfig.model_validate(base)


@dataclass
class Run:
    outcome: Outcome
    events: list[Event] = field(default_factory=list)

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]

    @property
    def losses(self) -> list[tuple[int, float]]:
        return [(e.step, e.loss) for e in self.of(Progress) if e.loss is not None]

    @property
    def completed(self) -> Completed:
        assert self.outcome.completed is not None, f"job did not complete: {self.outcome}"
        return self.outcome.completed

    @property
    def failure(self) -> str:
        failed = self.of(Failed)
        return failed[0].message if failed else self.outcome.message

    def messages(self) -> list[str]:
        return [e.message for e in self.events if isinstance(e, (Log, WarningEvent))]


def run_job(
    cfg: JobConfig,
    on_event: Callable[[Supervisor, Event], None] | None = None,
    timeout: float = 240,
    **supervisor_kwargs: Any,
) -> Run:
    """Run a real worker to its end; `on_event(supervisor, event)` can inject commands."""
    events: list[Event] = []
    lock = threading.Lock()
    holder: dict[str, Supervisor] = {}

    def handle(batch: list[Event]) -> None:
        for event in batch:
            with lock:
                events.append(event)
            if on_event is not None:
                on_event(holder["sup"], event)

    # A real worker forks from this test process's prewarmed forkserver, as a server's jobs do: it imported torch,
    # transformers, peft and trl once (a spawned worker pays ~10 s of CPU for them, every job). It has the
    # environment of its start: a test that sets a variable for its worker passes prewarm=False.
    real = "target" not in supervisor_kwargs and "executor" not in supervisor_kwargs
    supervisor_kwargs.setdefault("prewarm", real)
    sup = Supervisor(cfg, handle, **supervisor_kwargs)
    holder["sup"] = sup
    sup.start()
    outcome = sup.wait(timeout)
    assert outcome is not None, f"job did not end within {timeout}s"
    return Run(outcome, events)
