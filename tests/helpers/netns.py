"""Private network namespaces for tests: torchrun's store and Ray listen on every interface otherwise."""

from __future__ import annotations

import functools
import shutil
import subprocess


@functools.cache
def namespace_problem() -> str | None:
    """Why `unshare -n` (with `ip link set lo up` inside) cannot run here, or None when it can."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare or ip is not installed"
    probe = subprocess.run(["unshare", "-n", "ip", "link", "set", "lo", "up"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot make a private network namespace here (unshare -n needs root): {probe.stderr.strip()}"
    return None


def private_network() -> bool:
    return namespace_problem() is None
