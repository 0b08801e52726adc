"""One rank of a data-parallel job: `torchrun ... -m tunestudio.worker.rank` (see jobs/torchrun.py).

Every rank runs the same recipe (worker/main.py); they differ in three ways:
- only rank 0 talks to the supervisor: it connects to the job's link (a Unix
  socket in a private folder, authenticated by a token from the environment),
  receives the config and secrets as the first line, sends events as JSON
  lines (the protocol of QueueChannel) and reads Stop commands;
- the config reaches the other ranks from rank 0 (a broadcast), so secrets
  never touch a file or an environment variable;
- a stop is agreed: at each step boundary rank 0 broadcasts what it was asked,
  so every rank stops at the same step and the checkpoint is consistent; only
  rank 0 (`Channel.is_main`) writes artefacts and reports the end.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
from typing import Any

from tunestudio.events import Stop
from tunestudio.worker.channel import Channel
from tunestudio.worker.child import die_with_parent, freeze_imports
from tunestudio.worker.optional import hide_unused

# Environment the executor sets for the launcher (and so for every rank).
LINK_ENV = "TUNESTUDIO_LINK"
TOKEN_ENV = "TUNESTUDIO_LINK_TOKEN"
MANAGER_PID_ENV = "TUNESTUDIO_MANAGER_PID"

_NO_STOP, _STOP_SAVE, _CANCEL = 0, 1, 2


class RankChannel(Channel):
    """Rank 0: events out over the link, commands in. Other ranks: events dropped, stops agreed with rank 0."""

    def __init__(self, link: socket.socket | None, rank: int, world_size: int, group: Any = None) -> None:
        super().__init__()
        self.is_main = rank == 0
        self.rank = rank
        self.world_size = world_size
        self._group = group
        self._link = link
        self._out = link.makefile("w", encoding="utf-8", newline="\n") if link is not None else None
        if link is not None:
            threading.Thread(target=self._read_commands, args=(link,), name="commands", daemon=True).start()

    def _send(self, line: str) -> None:
        if self._out is None:
            return
        try:
            self._out.write(line + "\n")
            self._out.flush()
        except (OSError, ValueError):
            pass  # the supervisor is gone; the parent watch ends this process

    def failed(self, message: str, traceback: str = "") -> None:
        if not self.is_main:  # nobody hears this rank's events: its log does
            print(f"rank {self.rank} failed: {message}\n{traceback}", file=sys.stderr, flush=True)
        super().failed(message, traceback)

    def _read_commands(self, link: socket.socket) -> None:
        try:
            for line in link.makefile("r", encoding="utf-8"):
                if line.strip():
                    self.receive(line)
        except (OSError, ValueError):
            return

    @property
    def stop_request(self) -> Stop | None:
        """Rank 0's stop, the same on every rank. A collective: every rank reads it at the same points."""
        local = self._stop
        if self.world_size == 1:
            return local
        import torch
        import torch.distributed as dist

        code = _NO_STOP if local is None else (_STOP_SAVE if local.save else _CANCEL)
        agreed = torch.tensor([code], dtype=torch.int64)
        dist.broadcast(agreed, src=0, group=self._group)
        value = int(agreed.item())
        return None if value == _NO_STOP else Stop(save=value == _STOP_SAVE)

    def close(self) -> None:
        if self._out is not None:
            try:
                self._out.flush()
                assert self._link is not None
                self._link.shutdown(socket.SHUT_WR)
            except (OSError, ValueError):
                pass


def connect_link() -> tuple[socket.socket, dict[str, Any]]:
    """Rank 0's link to the supervisor, and the start message it sends back (config and secrets)."""
    link = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    link.connect(os.environ[LINK_ENV])
    link.sendall(os.environ[TOKEN_ENV].encode() + b"\n")
    first = bytearray()
    while not first.endswith(b"\n"):
        chunk = link.recv(65536)
        if not chunk:
            raise ConnectionError("the supervisor closed the link before sending the job")
        first += chunk
    return link, json.loads(first)


def main() -> int:
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    die_with_parent(int(os.environ[MANAGER_PID_ENV]))  # our parent is the launcher; the manager is watched
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a stop is a command, not a signal
    # Rank 0 connects before the heavy imports, so the supervisor hears from the job early.
    link, start = connect_link() if rank == 0 else (None, None)

    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if cuda else "gloo")
    # Control messages (the job, the stop) travel on CPU tensors: a gloo group beside nccl.
    group = dist.new_group(backend="gloo") if cuda else None
    box = [start]
    dist.broadcast_object_list(box, src=0, group=group)
    start = box[0]
    assert start is not None
    hide_unused(start["config"])  # before the modelling libraries load (worker/optional.py)

    from tunestudio.worker.main import run
    from tunestudio.worker.resources import Sampler

    freeze_imports(trains=True)
    channel = RankChannel(link, rank, world_size, group)
    # Rank 0 samples the launcher's tree: every rank on this machine (worker/resources.py).
    sampler = Sampler(channel, root_pid=os.getppid()).start() if rank == 0 else None
    code = 1
    try:
        code = run(start["config"], channel, start["secrets"])
    finally:
        if sampler is not None:
            sampler.stop()
        channel.close()
        if code == 0:  # after a failure another rank may never arrive; just leave
            dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
