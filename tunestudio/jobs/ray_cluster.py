"""A job on a Ray cluster: Ray Train's TorchTrainer with `num_processes` workers.

The driver (`python -m tunestudio.worker.ray.job`) is a subprocess of the
manager, launched and watched exactly like the torchrun launcher (see
`LauncherExecutor`): its own process group, death with the manager, the job
over a token-checked Unix socket, events and Stop commands as JSON lines. The
driver relays them to the ranks through a Ray actor's queues. Killing the driver ends
the job on the cluster: its workers and mailbox are actors of the driver's Ray
job, and Ray removes a job's actors when its driver exits.

The cluster need not share a disk with this machine: the driver ships the
job's local inputs through Ray's object store and writes what the ranks send
back into the job's output folder (worker/ray/job.py).
"""

from __future__ import annotations

import json
import os
import sys

from tunestudio.jobs.torchrun import LauncherExecutor

# What the driver reads (worker/ray/job.py); set from the settings, so a value set in code reaches it too.
ADDRESS_ENV = "TUNESTUDIO_RAY_ADDRESS"
RESOURCES_ENV = "TUNESTUDIO_RAY_WORKER_RESOURCES"
STORAGE_ENV = "TUNESTUDIO_RAY_STORAGE"


class RayExecutor(LauncherExecutor):
    """worker_resources: what each training worker asks the cluster for (None: Ray Train's default, a GPU
    when the cluster has one per rank, else a CPU). storage: a storage URI for Ray Train's storage, or None
    (checkpoints and artefacts come back through the object store)."""

    def __init__(self, num_processes: int, address: str | None, worker_resources: dict[str, float] | None = None,
                 storage: str | None = None) -> None:
        super().__init__(num_processes)
        self.address = address
        self.worker_resources = worker_resources
        self.storage = storage

    def _command(self) -> list[str]:
        return [sys.executable, "-m", "tunestudio.worker.ray.job"]

    def _environment(self) -> dict[str, str]:
        # No address: "auto", the cluster this machine's `ray start` joined. Empty values override what the
        # manager's own environment holds: the settings passed in code are the ones in force.
        return {
            ADDRESS_ENV: self.address or "",
            RESOURCES_ENV: json.dumps(self.worker_resources) if self.worker_resources else "",
            STORAGE_ENV: self.storage or "",
            "RAY_USAGE_STATS_ENABLED": "0",
            # Ray Train sends a rank's print() through the root logger as well as to the stream (a second copy of
            # each line in the job's log), and even while a library has stdout captured: dill's disassembly,
            # when datasets fingerprints TRL's functions, ran to 1,500 lines of bytecode a job. Ray propagates
            # this setting from the driver to its ranks. Their output still reaches the job's log (Ray sends it
            # to the driver); a user who wants it in Ray Train's own log files sets it to 1.
            "RAY_TRAIN_ENABLE_PRINT_PATCH": os.environ.get("RAY_TRAIN_ENABLE_PRINT_PATCH", "0"),
        }
