"""Processes sharing one data directory: who owns a job, stop requests between them, one FIFO.

Every job row names its owner (the pid of the server or CLI run that queued or
runs it). Another process never touches a live job directly: it leaves a stop
request in the row, which the owner's scheduler takes within
`request_poll_seconds`. Queued jobs start oldest first across all processes,
and a job whose owner died is the next process's to recover.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from tunestudio.jobs.models import Job, JobConflict
from tunestudio.jobs.status import JobStatus
from tunestudio.jobs.store import Store
from tunestudio.process import pid_alive


class Owners:
    def __init__(self, store: Store, poll_seconds: float) -> None:
        self.store = store
        self.poll_seconds = poll_seconds
        self.me = os.getpid()

    def owned_elsewhere(self, row: dict[str, Any]) -> bool:
        """Whether another live process owns this job."""
        owner = row.get("owner_pid")
        return bool(owner) and owner != self.me and pid_alive(owner)

    def orphans(self) -> Iterator[dict[str, Any]]:
        """Unfinished jobs, oldest first, whose owner is this process or gone: this process's to recover."""
        for row in self.store.list_jobs(limit=1_000_000, oldest_first=True):
            if not JobStatus(row["status"]).is_terminal and not self.owned_elsewhere(row):
                yield row

    def ask(self, job_id: str, save: bool, get: Callable[[str], Job]) -> Job:
        """Leave a stop (save) or cancel request for a live job another process runs.

        Answers with the status the owner moves the job to (stopping, cancelling), as a local stop does.
        Raises JobConflict when the owner is gone.
        """
        row = self.store.get_job(job_id) or {}
        owner = row.get("owner_pid")
        if not owner or owner == self.me or not pid_alive(owner):
            raise JobConflict(f"job {job_id} is {row.get('status')}, but the process that ran it (pid {owner}) is "
                              "gone; it becomes interrupted when tunestudio next starts on this data directory")
        wanted = "stop" if save else "cancel"
        if row.get("stop_request") != "cancel":  # a cancel is not downgraded to a stop
            self.store.update_job(job_id, wait=True, stop_request=wanted)
        deadline = time.monotonic() + 2 * self.poll_seconds + 3.0
        job = get(job_id)
        while job.status.value == row["status"] and time.monotonic() < deadline:
            time.sleep(0.05)
            job = get(job_id)
        return job

    def requests(self) -> Iterator[tuple[str, bool]]:
        """(job id, save) for each stop request left for this process, each taken once."""
        for job_id, wanted in self.store.stop_requests(self.me):
            if self.store.take_stop_request(job_id, wanted):  # else changed meanwhile: the next round takes it
                yield job_id, wanted != "cancel"

    def older_job_waits_elsewhere(self, job_id: str) -> bool:
        """Whether a job queued before this one waits in another live process on this data directory."""
        row = self.store.get_job(job_id)
        if row is None:
            return False
        return any(
            owner and owner != self.me and pid_alive(owner)
            for owner in self.store.queued_owners_before(row["created_at"])
        )
