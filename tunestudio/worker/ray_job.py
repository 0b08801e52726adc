"""A job on a Ray cluster: the driver (`python -m tunestudio.worker.ray_job`) and each rank's loop.

The driver is a subprocess of the manager (jobs/ray_cluster.py), so the manager
never imports ray or torch. It takes the job over the same link as torchrun's
rank 0 (worker/rank.py: a token-checked Unix socket, the job as the first
line), connects to the cluster at TUNESTUDIO_RAY_ADDRESS, and runs Ray Train's
`TorchTrainer` with `num_processes` workers; each runs the ordinary recipe
(worker/main.py) with a `RankChannel`. Events and commands cross the cluster
in two Ray queues (actors of this driver's job): rank 0 puts events, the
driver forwards them up the link; Stop commands go the other way and rank 0
broadcasts them to every rank at each step boundary. The queues and the
workers are the driver's: when it exits, however it exits, Ray removes them.

The output folder must be a path every node sees (a shared filesystem):
rank 0 writes the artefacts and checkpoints there, as a local job does.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import sys
import threading
from pathlib import Path
from typing import Any

from tunestudio.worker.child import die_with_parent
from tunestudio.worker.launch import RESULT_ENV
from tunestudio.worker.rank import MANAGER_PID_ENV, RankChannel, connect_link

ADDRESS_ENV = "TUNESTUDIO_RAY_ADDRESS"
POLL_S = 0.2


class RayRankChannel(RankChannel):
    """A rank inside a Ray Train worker: rank 0's events into a Ray queue, its commands from another."""

    def __init__(self, rank: int, world_size: int, events: Any, commands: Any) -> None:
        group = None
        if world_size > 1:
            import torch
            import torch.distributed as dist

            # The agreed stop travels on a CPU tensor: a gloo group beside nccl on GPUs.
            group = dist.new_group(backend="gloo") if torch.cuda.is_available() else None
        super().__init__(None, rank, world_size, group)
        self._events_queue = events if rank == 0 else None
        self._closed = threading.Event()
        if rank == 0:
            threading.Thread(target=self._poll_commands, args=(commands,), name="commands", daemon=True).start()

    def _send(self, line: str) -> None:
        if self._events_queue is not None:
            self._events_queue.put(line)

    def _poll_commands(self, commands: Any) -> None:
        while not self._closed.is_set():
            try:
                line = commands.get(block=True, timeout=POLL_S)
            except Exception:  # queue.Empty, or the driver (and so the queue actor) is gone
                continue
            self.receive(line)

    def close(self) -> None:
        self._closed.set()


def train_loop(loop_config: dict[str, Any]) -> None:
    """One rank, inside a Ray Train worker (torch.distributed is set up by Ray Train)."""
    import ray.train

    from tunestudio.worker.main import run

    context = ray.train.get_context()
    channel = RayRankChannel(
        context.get_world_rank(), context.get_world_size(), loop_config["events"], loop_config["commands"]
    )
    start = loop_config["start"]
    try:
        code = run(start["config"], channel, start["secrets"])
    finally:
        channel.close()
    if code != 0:
        raise RuntimeError(f"rank {context.get_world_rank()}: the job failed (its Failed event says why)")


def _forward_events(events: Any, link: Any, done: threading.Event) -> None:
    """Rank 0's events, from the Ray queue up the link, until the job is done and the queue empty."""
    while True:
        try:
            line = events.get(block=True, timeout=POLL_S)
        except queue.Empty:
            if done.is_set():
                return
            continue
        except Exception:
            return  # the queue actor is gone
        with contextlib.suppress(OSError):
            link.sendall(line.encode() + b"\n")


def _forward_commands(link: Any, commands: Any) -> None:
    with contextlib.suppress(OSError, ValueError):
        for line in link.makefile("r", encoding="utf-8"):
            if line.strip():
                commands.put(line)


def main() -> int:
    die_with_parent(int(os.environ[MANAGER_PID_ENV]))
    link, start = connect_link()
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.util.queue import Queue

    ray.init(address=os.environ.get(ADDRESS_ENV) or "auto", logging_level="WARNING")
    num_processes = int(start["config"].get("num_processes", 1))
    use_gpu = ray.cluster_resources().get("GPU", 0) >= num_processes
    events, commands = Queue(), Queue()
    done = threading.Event()
    forwarder = threading.Thread(target=_forward_events, args=(events, link, done), daemon=True)
    forwarder.start()
    threading.Thread(target=_forward_commands, args=(link, commands), daemon=True).start()
    output_dir = Path(start["config"]["output_dir"])
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"start": start, "events": events, "commands": commands},
        scaling_config=ScalingConfig(num_workers=num_processes, use_gpu=use_gpu),
        # Ray Train's own bookkeeping, beside the artefacts on the shared path.
        run_config=RunConfig(name="ray-train", storage_path=str(output_dir / ".ray-train")),
    )
    code = 0
    try:
        trainer.fit()
    except Exception as exc:  # Ray Train's TrainingFailedError and friends: say which worker and why
        code = 1
        first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        result = os.environ.get(RESULT_ENV)
        if result:
            Path(result).write_text(json.dumps({"detail": f"ray: {first[:500]}"}))
        print(f"ray job failed: {exc}", file=sys.stderr, flush=True)
    finally:
        done.set()
        forwarder.join(timeout=30)
        with contextlib.suppress(OSError):
            link.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
