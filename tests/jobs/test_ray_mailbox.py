"""A Ray job's mailbox (worker/ray/mailbox.py) without a cluster: its two queues, each in order, apart, and a get
that times out with queue.Empty. Through Ray (the actor, the boxes pickled into the ranks), tests/jobs/test_ray.py."""

from __future__ import annotations

import asyncio
import pickle
import queue

import pytest

from tunestudio.worker.ray.mailbox import Box, Mailbox


def test_each_queue_keeps_its_order_and_an_empty_one_times_out() -> None:
    async def run() -> list[str]:
        mailbox = Mailbox()
        for item in ("placed", "log", "returned"):
            await mailbox.put("events", item)
        await mailbox.put("commands", "stop")
        got = [await mailbox.get("events", 1.0) for _ in range(3)]
        assert await mailbox.get("commands", 1.0) == "stop"
        for name in ("events", "commands"):
            with pytest.raises(queue.Empty):
                await mailbox.get(name, 0.05)
        return got

    assert asyncio.run(run()) == ["placed", "log", "returned"]


def test_a_waiting_get_does_not_hold_up_the_other_queue() -> None:
    async def run() -> str:
        mailbox = Mailbox()
        waiting = asyncio.ensure_future(mailbox.get("commands", 5.0))  # rank 0's poll, as it waits
        await mailbox.put("events", "log")
        got = await mailbox.get("events", 1.0)
        await mailbox.put("commands", "ack")
        assert await waiting == "ack"
        return got

    assert asyncio.run(run()) == "log"


def test_a_box_pickles_with_its_name() -> None:
    box = pickle.loads(pickle.dumps(Box("the actor handle", "commands")))
    assert (box.mailbox, box.name) == ("the actor handle", "commands")


def test_a_get_without_a_timeout_is_refused_before_reaching_ray() -> None:
    with pytest.raises(TypeError, match="with a timeout"):
        Box("the actor handle", "events").get()
