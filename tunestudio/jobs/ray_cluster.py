"""A job on a Ray cluster: Ray Train's TorchTrainer with `num_processes` workers.

The driver (`python -m tunestudio.worker.ray_job`) is a subprocess of the
manager, launched and watched exactly like the torchrun launcher (see
`LauncherExecutor`): its own process group, death with the manager, the job
over a token-checked Unix socket, events and Stop commands as JSON lines. The
driver relays them to the ranks through Ray queues. Killing the driver ends
the job on the cluster: its workers and queues are actors of the driver's Ray
job, and Ray removes a job's actors when its driver exits.
"""

from __future__ import annotations

import sys

from tunestudio.jobs.torchrun import LauncherExecutor


class RayExecutor(LauncherExecutor):
    def __init__(self, num_processes: int, address: str | None) -> None:
        super().__init__(num_processes)
        self.address = address

    def _command(self) -> list[str]:
        return [sys.executable, "-m", "tunestudio.worker.ray_job"]

    def _environment(self) -> dict[str, str]:
        # No address: "auto", the cluster this machine's `ray start` joined.
        return {"TUNESTUDIO_RAY_ADDRESS": self.address or "", "RAY_USAGE_STATS_ENABLED": "0"}
