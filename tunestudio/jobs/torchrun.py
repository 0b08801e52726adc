"""A job as N data-parallel ranks under torchrun, on this machine.

The launcher (`python -m tunestudio.worker.launch`, torchrun plus a failure
report) is a subprocess: this side never imports torch. It leads its own
process group, gets PR_SET_PDEATHSIG before it runs, and watches the manager
itself; torchrun puts each rank in a session of its own, so `kill` signals the
ranks' groups as well as the launcher's.

Rank 0 reports: it connects to a Unix socket in a private folder (0700) and
proves itself with a token from its environment; the first line back is the
job (config and secrets: never in a file or an environment variable), then
Stop commands go down and events come up as JSON lines, the QueueChannel
protocol. The other ranks get the job from rank 0 (worker/rank.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import hmac
import json
import os
import secrets as secrets_mod
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from tunestudio.events import Stop
from tunestudio.kinds import spec_of
from tunestudio.process import kill_group, torch_threads, usable_cores
from tunestudio.worker.child import WorkerKind

PR_SET_PDEATHSIG = 1
ACCEPT_LINE_TIMEOUT_S = 5.0


def _die_with_manager() -> None:  # runs in the child between fork and exec: no Python-level locks
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                found.update(int(p) for p in Path(f"/proc/{pid}/task/{task}/children").read_text().split())
    return found


def describe_rank_exit(rank: int, code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"rank {rank} killed by signal {-code} ({name})"
    return f"rank {rank} exited with code {code}"


class LauncherExecutor:
    """A job whose launcher is a subprocess of this one and whose rank 0 reports over the link.

    Subclasses say which launcher runs (`_command`) and what it needs to know (`_environment`).
    """

    def __init__(self, num_processes: int) -> None:
        self.num_processes = num_processes
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: str | None = None
        self._server: socket.socket | None = None
        self._link: socket.socket | None = None
        self._link_closed = False
        self._buffer = b""
        self._token = ""
        self._start_line = b""
        self._pending: list[bytes] = []
        self._send_lock = threading.Lock()
        self._ranks: set[int] = set()

    # --- start -------------------------------------------------------------------
    def start(
        self, public_config: dict[str, Any], secrets: dict[str, str], log_path: str | None, kind: WorkerKind = "train",
        config: Any = None,
    ) -> None:
        """The JSON form crosses to the launcher (its ranks validate it); `config` is not sent."""
        if not spec_of(kind).distributed:  # exports run as one local process (executor_for)
            raise ValueError(f"a {type(self).__name__} runs training jobs only, not {kind}")
        self._dir = tempfile.mkdtemp(prefix="tunestudio-ddp-")  # 0700: only this user reaches the link
        link_path = os.path.join(self._dir, "link")
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(link_path)
        self._server.listen(1)
        self._token = secrets_mod.token_hex(32)
        self._start_line = json.dumps({"config": public_config, "secrets": secrets}).encode() + b"\n"
        env = dict(os.environ)
        env.update(
            TUNESTUDIO_LINK=link_path,
            TUNESTUDIO_LINK_TOKEN=self._token,
            TUNESTUDIO_MANAGER_PID=str(os.getpid()),
            TUNESTUDIO_LAUNCH_RESULT=os.path.join(self._dir, "result.json"),
        )
        env.update(self._environment())
        command = self._command()
        log = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115 (closed below)
        try:
            self._proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own process group, out of reach of the terminal's Ctrl-C
                preexec_fn=_die_with_manager,  # only a prctl call: safe between fork and exec
            )
        finally:
            if log is not subprocess.DEVNULL:
                log.close()

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _environment(self) -> dict[str, str]:
        return {}

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    # --- watching ------------------------------------------------------------------
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def join(self, timeout: float) -> None:
        if self._proc is None:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout)

    def exitcode(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    def exit_detail(self) -> str | None:
        """Which rank failed first and how (the launcher's report), when that, not rank 0's own report, is the cause.

        None when no rank failed, or when rank 0 failed first with an exit code: then
        rank 0's Failed event (or the exit code) says it all.
        """
        if self._dir is None:
            return None
        try:
            result = json.loads(Path(self._dir, "result.json").read_text())
            if "detail" in result:
                return str(result["detail"])
            rank, code = int(result["rank"]), int(result["exitcode"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if rank == 0 and code > 0:
            return None
        return describe_rank_exit(rank, code)

    # --- talking -------------------------------------------------------------------
    def send(self, command: Stop) -> None:
        line = command.model_dump_json().encode() + b"\n"
        with self._send_lock:
            if self._link is None:
                self._pending.append(line)  # rank 0 has not connected yet: it gets it on connecting
                return
            with contextlib.suppress(OSError):
                self._link.sendall(line)

    def next_item(self, timeout: float) -> object | None:
        """Every complete line that arrived (newline-joined, as QueueChannel sends a burst), or None."""
        if self._link is None:
            if not self._accept(timeout):
                return None
            timeout = 0.0
        lines = self._complete_lines()
        if lines is not None:
            return lines
        if self._link_closed or self._link is None:
            self.join(timeout)  # nothing more can come: wait like a quiet queue would
            return None
        ready, _, _ = select.select([self._link], [], [], timeout)
        if ready:
            try:
                chunk = self._link.recv(1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                self._link_closed = True
            self._buffer += chunk
        return self._complete_lines()

    def _complete_lines(self) -> str | None:
        end = self._buffer.rfind(b"\n")
        if end < 0:
            return None
        done, self._buffer = self._buffer[:end], self._buffer[end + 1 :]
        return done.decode("utf-8", errors="replace")

    def _accept(self, timeout: float) -> bool:
        """Take rank 0's connection if it proves itself with the token; send it the job."""
        if self._server is None:
            return False
        ready, _, _ = select.select([self._server], [], [], timeout)
        if not ready:
            return False
        conn, _ = self._server.accept()
        conn.settimeout(ACCEPT_LINE_TIMEOUT_S)
        first = b""
        try:
            while not first.endswith(b"\n") and len(first) < 256:
                chunk = conn.recv(256)
                if not chunk:
                    break
                first += chunk
            if not hmac.compare_digest(first.strip(), self._token.encode()):
                conn.close()
                return False
            conn.sendall(self._start_line)
        except OSError:
            conn.close()
            return False
        conn.settimeout(None)
        self._start_line = b""  # the secrets are rank 0's now; keep no copy
        with self._send_lock:
            self._link = conn
            for line in self._pending:
                with contextlib.suppress(OSError):
                    conn.sendall(line)
            self._pending.clear()
        self._server.close()
        self._server = None
        return True

    # --- ending ----------------------------------------------------------------------
    def kill(self, sig: int) -> None:
        """Signal every rank's group and the launcher's; gone already is not an error."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._ranks |= _children(self._proc.pid)
        for rank_pid in self._ranks:
            kill_group(rank_pid, sig)
        kill_group(self._proc.pid, sig)

    def rank_pids(self) -> set[int]:
        """The ranks' processes as the launcher's children now (empty once it is gone)."""
        return _children(self._proc.pid) if self._proc is not None else set()

    @staticmethod
    def children_of(launcher_pid: int) -> set[int]:
        """A launcher's children (its ranks under torchrun), for one that another process started."""
        return _children(launcher_pid)

    def close(self) -> None:
        """Drop the link and its private folder (after the launcher exited)."""
        for sock in (self._link, self._server):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)


class TorchrunExecutor(LauncherExecutor):
    """N ranks under torchrun on this machine; the launcher process stands for the job.

    private_network: run the launcher and its ranks in a network namespace of their own
    with only loopback (`unshare -n`; needs root or CAP_SYS_ADMIN). torchrun's rendezvous
    store listens on every interface (torch binds it so, whatever --master-addr says);
    in the namespace nothing is reachable from outside. The link is a Unix socket, which
    crosses network namespaces.
    """

    def __init__(self, num_processes: int, private_network: bool = False) -> None:
        if num_processes < 2:
            raise ValueError("num_processes: torchrun runs 2 or more ranks; 1 runs as a local process")
        super().__init__(num_processes)
        self.private_network = private_network

    def _command(self) -> list[str]:
        # unshare execs the launcher in place: same pid, same process group, PR_SET_PDEATHSIG kept.
        prefix = ["unshare", "--net"] if self.private_network else []
        return [
            *prefix,
            sys.executable, "-m", "tunestudio.worker.launch",
            "--nnodes", "1",
            "--nproc-per-node", str(self.num_processes),
            "--master-addr", "127.0.0.1",
            "--master-port", str(_free_port()),
            "--monitor-interval", "0.2",  # notice a dead rank within a fraction of a second
            "-m", "tunestudio.worker.rank",
        ]

    def _environment(self) -> dict[str, str]:
        cores = usable_cores()
        # N ranks share the cores: torch threads per rank (worker/train/performance.py makes the same split).
        env = {"OMP_NUM_THREADS": str(torch_threads(max(1, cores // self.num_processes)))}
        if self.private_network:
            env["TUNESTUDIO_LOOPBACK_UP"] = "1"  # the launcher brings the namespace's lo up first
        if os.path.exists("/sys/class/net/lo"):  # one machine: collectives stay on loopback
            env["GLOO_SOCKET_IFNAME"] = os.environ.get("GLOO_SOCKET_IFNAME", "lo")
            env["NCCL_SOCKET_IFNAME"] = os.environ.get("NCCL_SOCKET_IFNAME", "lo")
        return env
