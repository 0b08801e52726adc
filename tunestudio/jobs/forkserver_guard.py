"""Imported first in the worker forkserver (see prewarm.FORKSERVER_PRELOAD): it ends within POLL_S of its parent.

multiprocessing's forkserver exits when every holder of its "alive" pipe is
gone (the parent and each worker it forked), and only once its preload imports
are done (seconds) and an interpreter with torch loaded has shut down (seconds
more). This watch makes it exit at once (os._exit) when the process that
started it is gone, even in the middle of its preload. Workers forked from it
do not inherit the watch (a fork copies only the forking thread); they have
their own (worker/child.py) and PR_SET_PDEATHSIG on the forkserver.

When the parent is gone after the preload, multiprocessing's own loop sees
its "alive" pipe close first and exits through SystemExit, and the interpreter
shutdown that follows freezes the watch (a daemon thread) and takes seconds with
torch loaded; an atexit hook ends that shutdown at once too (the forkserver
holds nothing to flush; its children end through os._exit and never run it).

It acts only while multiprocessing's forkserver imports its preload, and only
when the process that started it named itself in PARENT_ENV (prewarm.py does);
imported anywhere else it does nothing.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time

PARENT_ENV = "TUNESTUDIO_FORKSERVER_PARENT"
POLL_S = 0.1


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_S)
    os._exit(0)  # no interpreter shutdown: nothing here needs one, and it takes seconds with torch loaded


def _in_forkserver_preload() -> bool:
    from multiprocessing import forkserver

    frame = sys._getframe()
    while frame is not None:
        if frame.f_code is forkserver.main.__code__:
            return True
        frame = frame.f_back
    return False


def _start() -> None:
    parent = os.environ.get(PARENT_ENV, "")
    if not parent.isdigit() or not _in_forkserver_preload():
        return
    threading.Thread(target=_watch, args=(int(parent),), name="forkserver-guard", daemon=True).start()
    atexit.register(_exit_now, os.getpid())


def _exit_now(pid: int) -> None:
    if os.getpid() == pid:  # the forkserver itself, never a process forked from it
        os._exit(0)


_start()
