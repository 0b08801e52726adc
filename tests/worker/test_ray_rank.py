"""worker/ray/rank.py's command poller (rank 0 of a Ray job): the driver's commands reach the channel, and a driver
that is gone (its mailbox actor with it, so every get fails at once) costs the poller a wait between tries, not a
busy loop until the rank closes. No cluster: the commands box is a stand-in with Box's `get`."""

from __future__ import annotations

import queue
import threading
from typing import Any

from tunestudio.events import Stop
from tunestudio.worker.ray.rank import POLL_S, RayRankChannel

from ..helpers.wait import wait_until


class Commands:
    """A commands box: one stop, then nothing (queue.Empty after the timeout), then the actor gone."""

    def __init__(self) -> None:
        self.calls = 0
        self.gone = threading.Event()

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        self.calls += 1
        if self.calls == 1:
            return Stop(save=True).model_dump_json()
        if not self.gone.is_set():
            self.gone.wait(timeout)
            raise queue.Empty
        raise RuntimeError("The actor died unexpectedly before finishing this task.")  # as ray.get says it


def test_a_stop_is_received_and_a_gone_driver_is_polled_at_its_pace_not_in_a_busy_loop() -> None:
    commands = Commands()
    channel = RayRankChannel(0, 1, events=queue.Queue(), commands=commands)
    try:
        wait_until(lambda: channel.stop_request is not None, 10, "the stop received")
        assert channel.stop_request == Stop(save=True)
        commands.gone.set()
        before = commands.calls
        threading.Event().wait(5 * POLL_S)
        tries = commands.calls - before
        assert 1 <= tries <= 7, tries  # about one try per POLL_S (a busy loop makes thousands)
    finally:
        channel.close()
