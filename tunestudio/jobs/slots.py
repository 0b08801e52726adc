"""Job slots shared by every process on one data directory.

A server and a `tunestudio train` beside it must not run more jobs at once
than `max_concurrent_jobs` says (one GPU, one job). A slot is an exclusive
`flock` on `slots/slot-N.lock`; the kernel drops it when its holder closes the
file or dies, even by SIGKILL, so a crashed process never keeps a slot.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class Slots:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def acquire(self, count: int) -> int | None:
        """A free slot among the first `count` (an open file descriptor: the lock), or None if all are held."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for index in range(count):
            fd = os.open(self.directory / f"slot-{index}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return fd
        return None

    @staticmethod
    def release(fd: int) -> None:
        os.close(fd)  # closing the file drops its lock
