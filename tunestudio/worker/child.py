"""The first code a supervised worker process runs.

The parent references `main` to spawn the process, so this module imports
nothing heavy at the top: torch and friends load inside `main`, in the child.

Before the job starts, the child makes sure it can never outlive its parent:
it leads its own process group (so the supervisor can signal the whole group),
asks the kernel for SIGKILL when the parent dies (PR_SET_PDEATHSIG), and, as a
fallback, watches the parent's pid.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

PR_SET_PDEATHSIG = 1
PARENT_POLL_S = 0.5


def pid_alive(pid: int | None) -> bool:
    """Whether a process exists and is not a zombie (pid 0 or None: no)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a killed parent that nobody has reaped yet is a zombie: gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return True


def _die_with_parent(manager_pid: int) -> None:
    """Exit (with the whole process group) as soon as the manager process is gone.

    Our direct parent is the manager (spawn) or the prewarmed forkserver, which
    itself exits when the manager does. PR_SET_PDEATHSIG covers the direct
    parent; the watch covers the manager itself, a parent that died before
    prctl ran, and PDEATHSIG's quirk of firing when the parent *thread* ends.
    """
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # the watch below still holds
    first_parent = os.getppid()
    if first_parent == 1 or not pid_alive(manager_pid):
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(PARENT_POLL_S)
            if os.getppid() != first_parent or not pid_alive(manager_pid):
                os.killpg(os.getpgid(0), signal.SIGKILL)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _redirect_output(log_path: str | None) -> None:
    """Library chatter (warnings, progress bars) goes to the job's log file, not the parent's terminal."""
    if not log_path:
        return
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def main(
    public_config: dict[str, Any],
    secrets: dict[str, str],
    events: Any,
    commands: Any,
    parent_pid: int,
    log_path: str | None,
) -> None:
    os.setpgid(0, 0)
    _die_with_parent(parent_pid)
    _redirect_output(log_path)
    # A stop is a command, not a signal: Ctrl-C in the parent's terminal must not reach us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    from tunestudio.worker.channel import QueueChannel
    from tunestudio.worker.main import run

    channel = QueueChannel(events, commands)
    code = 1
    try:
        code = run(public_config, channel, secrets)
    finally:
        channel.close()
        sys.stdout.flush()
        sys.stderr.flush()
    # A worker that hangs in teardown after this is killed by the supervisor's exit bound.
    sys.exit(code)
