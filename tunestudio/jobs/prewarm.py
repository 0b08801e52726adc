"""How worker processes are started: a fresh interpreter (spawn), or a fork of a prewarmed server.

A spawned worker pays ~3.5 s of imports (torch, transformers, trl, peft)
before it does anything. With prewarm on (the default; TUNESTUDIO_PREWARM=0
turns it off), workers are forked from multiprocessing's forkserver, which
imported those modules once. Every job still gets a process no earlier job
touched: each is a new fork of the idle server. The server only imports: it
never runs torch code, so it has no CUDA context and no thread pools that a
fork would break. If it dies, `ensure_running` starts a new one at the next job.
"""

from __future__ import annotations

import logging
import threading
from multiprocessing import forkserver
from typing import Any

from tunestudio.process import start_context
from tunestudio.worker.child import PRELOAD

log = logging.getLogger(__name__)

def context(prewarm: bool) -> Any:
    """The context workers start from (see `tunestudio.process.start_context`)."""
    return start_context(prewarm, PRELOAD)


def warm_up() -> threading.Thread:
    """Start (or restart) the forkserver in the background, so the first job finds it warm."""

    context(True)  # the preload list must be set before the server starts

    def run() -> None:
        try:
            forkserver.ensure_running()
        except Exception:  # a job started later retries, and fails with a reason
            log.exception("could not start the worker forkserver")

    thread = threading.Thread(target=run, name="prewarm", daemon=True)
    thread.start()
    return thread
