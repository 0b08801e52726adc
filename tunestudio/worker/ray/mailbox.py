"""The queues of a Ray job, events (rank 0 to the driver) and commands (the driver to rank 0), in one actor.

`ray.util.queue.Queue` is an actor a queue: two Ray worker processes a job, each started (about 1.3 s of CPU,
bench/RESULTS.md) and kept for the job's life. A `Mailbox` holds both queues in one; a `Box` is one of them, with
the two calls the job makes of a queue (`put`, `get` with a timeout that raises `queue.Empty`), picklable, so the
driver hands the ranks their boxes in Train's loop config. The driver creates the mailbox (worker/ray/job.py), on
its own node, as an actor of its Ray job: when the driver exits, Ray removes it.
"""

from __future__ import annotations

import asyncio
import queue
from typing import Any


class Mailbox:
    """The Ray actor (an async one: a `get` waiting on one queue does not block a `put` on the other)."""

    def __init__(self) -> None:
        self._queues: dict[str, asyncio.Queue[Any]] = {"events": asyncio.Queue(), "commands": asyncio.Queue()}

    async def put(self, name: str, item: Any) -> None:
        self._queues[name].put_nowait(item)

    async def get(self, name: str, timeout: float) -> Any:
        try:
            return await asyncio.wait_for(self._queues[name].get(), timeout)
        except TimeoutError:
            raise queue.Empty from None  # Ray raises it in the caller as an error that is also a queue.Empty


class Box:
    """One queue of a `Mailbox` actor."""

    def __init__(self, mailbox: Any, name: str) -> None:
        self.mailbox = mailbox
        self.name = name

    def put(self, item: Any) -> None:
        import ray

        ray.get(self.mailbox.put.remote(self.name, item))

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """The next item, waiting up to `timeout` seconds for one (queue.Empty after); `block` is always true here."""
        import ray

        if not block or timeout is None:  # a caller's mistake, said as one (the job's loops take any other
            raise TypeError("Box.get waits, with a timeout")  # exception for a gone actor)
        return ray.get(self.mailbox.get.remote(self.name, timeout))


def open_boxes(ray: Any, options: dict[str, Any]) -> tuple[Box, Box]:
    """The job's mailbox, made with these actor options: its events box and its commands box."""
    mailbox = ray.remote(Mailbox).options(**options).remote()
    return Box(mailbox, "events"), Box(mailbox, "commands")
