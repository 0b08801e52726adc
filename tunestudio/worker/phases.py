"""The worker's steps inside a phase, said as they happen (events.WorkerStep): judging the base model before
training (its eval loss, its answers) and the result after it, each with how far it is.

A job's status does not change with a step: the manager records it as the job's `phase`, so the page and the
CLI say "evaluating base 3 / 8" instead of the phase before it for as long as the step takes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from tunestudio.worker.channel import Channel

__all__ = ["Steps"]

T = TypeVar("T")
EVERY_SECONDS = 1.0  # the most often a step's progress is sent (its first and last count always are)


class Steps:
    def __init__(self, channel: Channel) -> None:
        self.channel = channel

    def counter(self, step: str, message: str) -> Callable[[int, int], None]:
        """A progress callback (done, total) that says `step` with its count, at most every EVERY_SECONDS."""
        last = 0.0

        def progress(done: int, total: int) -> None:
            nonlocal last
            now = time.monotonic()
            if done in (0, total) or now - last >= EVERY_SECONDS:
                last = now
                self.channel.phase(step, message, done=done, total=max(total, done))

        return progress

    def each(self, step: str, message: str, items: Sequence[T], work: Callable[[T], str]) -> list[str]:
        """work(item) for each item, saying `step` with how many are done."""
        if not items:
            return []
        progress = self.counter(step, message)
        progress(0, len(items))
        out = []
        for item in items:
            out.append(work(item))
            progress(len(out), len(items))
        return out

    def evaluate(self, trainer: Any, step: str, message: str) -> dict[str, float]:
        """trainer.evaluate(), saying `step` with the evaluation batches done."""
        from transformers import TrainerCallback

        args = trainer.args
        total = math.ceil(len(trainer.eval_dataset) / max(1, args.eval_batch_size * max(1, args.world_size)))
        progress = self.counter(step, message)

        class _Batches(TrainerCallback):
            done = 0

            def on_prediction_step(self, *_: Any, **__: Any) -> None:
                self.done += 1
                progress(self.done, total)

        counting = _Batches()
        progress(0, total)
        trainer.add_callback(counting)
        try:
            return trainer.evaluate()
        finally:
            trainer.remove_callback(counting)
