"""One rank of a job on a Ray cluster, inside a Ray Train worker, on a node that may share no disk with the studio.

Read top to bottom, as the rank lives (`train_loop`):
1. stage: the node's folder for this job (`NodeStage`, in the node's own temporary folder); the first rank of
   the node to arrive writes the shipped inputs there from the object store, the others find them written;
2. place: tell the driver which node this rank runs on (`Placed`);
3. run the recipe (worker/main.py) on a config whose paths are the node's copies and whose output folder is
   the stage's; rank 0 sends each checkpoint back once it is complete (at the next step boundary, where every
   rank reads the stop command), then the artefacts; it holds its terminal event until the driver has written
   them into the job's output_dir, so `completed` means the files are on the studio's machine;
4. leave: the last rank of the node removes the stage.

A rank that never leaves (killed: its driver was, after a cancel's grace period, and Ray ends the driver's
workers) leaves its stage behind; each rank holds a shared lock on its run's `<run>.live` file while it lives,
so the next rank to enter a stage on that node sweeps the stages no live rank holds (`sweep_stale`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import queue
import shutil
import socket
import tempfile
import threading
from pathlib import Path
from typing import Any

from tunestudio.worker.rank import RankChannel
from tunestudio.worker.ray.ship import Ack, Input, Placed, Returned, localise, pack, shippable, unpack

POLL_S = 0.2
ACK_TIMEOUT_S = 3600.0  # the driver writes what rank 0 sent; it ends the job (and this rank) if it dies
STAGE_ROOT = "tunestudio-ray"


def _hold(path: Path, how: int) -> Any:
    """An open file of `path` locked with `how` (fcntl.LOCK_SH/LOCK_EX, maybe | LOCK_NB), or None when a
    non-blocking lock is taken by another; the file is the one at `path` now (a sweeper may have removed the one
    this process waited on)."""
    while True:
        handle = path.open("a")
        try:
            fcntl.flock(handle, how)
        except BlockingIOError:
            handle.close()
            return None
        try:
            same = os.fstat(handle.fileno()).st_ino == path.stat().st_ino
        except FileNotFoundError:
            same = False
        if same:
            return handle
        handle.close()


def sweep_stale(root: Path, keep: str = "") -> list[str]:
    """Remove the stages under `root` (a node's `$TMPDIR/tunestudio-ray`) whose ranks are all gone: no process
    holds their `<run>.live` lock (the kernel drops a killed process's locks). Returns the runs removed."""
    removed = []
    runs = {p.name.split(".")[0] for p in root.iterdir()} if root.is_dir() else set()
    for run in sorted(runs - {keep, ""}):
        live = root / f"{run}.live"
        handle = _hold(live, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if handle is None:  # a rank of that run is alive on this node
            continue
        with handle:
            shutil.rmtree(root / run, ignore_errors=True)
            for name in (f"{run}.lock", f"{run}.live"):
                with contextlib.suppress(OSError):
                    (root / name).unlink()
        removed.append(run)
    return removed


class NodeStage:
    """This job's folder on this node: `inputs/` (written once, under a lock), `output/` (the ranks' output
    folder), `users/` (one file per rank here; the last one out removes the folder). Each rank holds a shared
    lock on `<run>.live` from before the folder exists until it leaves or dies, so `sweep_stale` never takes a
    live stage."""

    def __init__(self, run_id: str) -> None:
        self.root = Path(tempfile.gettempdir()) / STAGE_ROOT / run_id
        self.root.parent.mkdir(parents=True, exist_ok=True)
        self._live = _hold(self.root.parent / f"{run_id}.live", fcntl.LOCK_SH)
        self.root.mkdir(exist_ok=True)
        self.output = self.root / "output"

    @contextlib.contextmanager
    def _locked(self) -> Any:
        with (self.root.parent / f"{self.root.name}.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def enter(self, rank: int, inputs: list[tuple[Input, Any]]) -> int:
        """Join the stage and make sure the inputs are written; returns the bytes this rank fetched (0 when
        another rank of the node had written them)."""
        with contextlib.suppress(OSError):  # stages that ranks killed on this node left behind
            sweep_stale(self.root.parent, keep=self.root.name)
        with self._locked():
            (self.root / "users").mkdir(exist_ok=True)
            (self.root / "users" / str(rank)).touch()
            if (self.root / "inputs.done").exists():
                return 0
            fetched = sum(unpack(shipment, item.node_folder(self.root, i)) for i, (item, shipment)
                          in enumerate(inputs))
            (self.root / "inputs.done").touch()
            return fetched

    def leave(self, rank: int) -> None:
        with self._locked():
            (self.root / "users" / str(rank)).unlink(missing_ok=True)
            if not any((self.root / "users").iterdir()):
                shutil.rmtree(self.root, ignore_errors=True)
        if not self.root.exists():
            with contextlib.suppress(OSError):
                (self.root.parent / f"{self.root.name}.lock").unlink()
        self._live.close()
        with contextlib.suppress(OSError):  # `<run>.live` once this node's last rank of the run is out
            sweep_stale(self.root.parent)


class Homeward:
    """Rank 0's output folder going back to the studio: each checkpoint once complete, then the artefacts.

    storage: Ray Train's storage context (a storage URI was set): the files are written there and the driver
    copies them; else they travel through the object store and the driver writes them.
    """

    def __init__(self, output: Path, events: Any, storage: Any = None) -> None:
        self.output = output
        self.events = events
        self.storage = storage
        self._sent: dict[str, float] = {}  # checkpoint name -> trainer_state.json's mtime when sent

    def _send(self, name: str, folder: Path, only: list[str] | None, present: list[str], final: bool) -> None:
        if self.storage is None:
            shipment = pack(folder, only)
            self.events.put(Returned(name, shipment=shipment, size=shipment.size, present=present, final=final))
            return
        from ray.train import Checkpoint

        stored_name = name or "artefacts"
        if only is not None:  # the artefacts: linked into a folder of their own, without the checkpoints
            upload = self.output.parent / "artefacts-upload"
            shutil.rmtree(upload, ignore_errors=True)
            for rel in only:
                (upload / rel).parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(folder / rel, upload / rel)
                except OSError:
                    shutil.copy2(folder / rel, upload / rel)
            folder = upload
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        self.storage.persist_current_checkpoint(Checkpoint.from_directory(str(folder)), stored_name)
        self.events.put(Returned(name, stored=stored_name, size=size, present=present, final=final))

    def send_new_checkpoints(self) -> list[str]:
        """Send every complete checkpoint not sent yet (or saved again since); returns the node's checkpoints."""
        checkpoints, _ = shippable(self.output)
        for name in checkpoints:
            state = self.output / name / "trainer_state.json"
            try:
                stamp = state.stat().st_mtime_ns
            except OSError:  # rotated away meanwhile
                continue
            if self._sent.get(name) != stamp:
                try:
                    self._send(name, self.output / name, None, checkpoints, final=False)
                except FileNotFoundError:  # rotated away while being packed
                    continue
                self._sent[name] = stamp
        return checkpoints

    def send_all(self) -> None:
        """The checkpoints not sent yet, then the artefacts (the final message, which the driver acknowledges)."""
        present = self.send_new_checkpoints()
        _, files = shippable(self.output)
        self._send("", self.output, files, present, final=True)


class RayRankChannel(RankChannel):
    """A rank inside a Ray Train worker: rank 0's events into the job's events box, its commands from its commands
    box (worker/ray/mailbox.py).

    Rank 0 holds its terminal event (Completed or Failed) until `release`: the driver forwards it only after
    the files it announces are on the studio's machine.
    """

    def __init__(self, rank: int, world_size: int, events: Any, commands: Any,
                 homeward: Homeward | None = None) -> None:
        group = None
        if world_size > 1:
            import torch
            import torch.distributed as dist

            # The agreed stop travels on a CPU tensor: a gloo group beside nccl on GPUs.
            group = dist.new_group(backend="gloo") if torch.cuda.is_available() else None
        super().__init__(None, rank, world_size, group)
        self._events_queue = events if rank == 0 else None
        self._homeward = homeward
        self._held: list[str] = []
        self._acked = threading.Event()
        self._ack = Ack()
        self._closed = threading.Event()
        if rank == 0:
            threading.Thread(target=self._poll_commands, args=(commands,), name="commands", daemon=True).start()

    def _send(self, line: str) -> None:
        if self._events_queue is None:
            return
        if json.loads(line).get("kind") in ("completed", "failed"):
            self._held.append(line)
            return
        self._events_queue.put(line)

    def _poll_commands(self, commands: Any) -> None:
        while not self._closed.is_set():
            try:
                item = commands.get(block=True, timeout=POLL_S)
            except queue.Empty:
                continue
            except Exception:  # the driver (and so the mailbox actor) is gone: each get fails at once, so wait
                self._closed.wait(POLL_S)
                continue
            if isinstance(item, Ack):
                self._ack = item
                self._acked.set()
            else:
                self.receive(item)

    @property
    def stop_request(self) -> Any:
        # A step boundary, where rank 0's last save is complete: send the checkpoints it finished.
        if self._homeward is not None:
            self._homeward.send_new_checkpoints()
        return super().stop_request

    def release(self) -> None:
        """Send the files home (waiting for the driver's word that they are written), then the held end."""
        if self._homeward is not None:
            try:
                self._homeward.send_all()
                if not self._acked.wait(ACK_TIMEOUT_S):
                    raise TimeoutError(f"the driver did not confirm the files within {ACK_TIMEOUT_S:.0f}s")
                if self._ack.error:
                    raise OSError(self._ack.error)
            except Exception as exc:
                self._held = []
                super().failed(f"the job's files could not be sent back to the studio: {type(exc).__name__}: "
                               f"{exc}")
        assert self._events_queue is not None
        for line in self._held:
            self._events_queue.put(line)
        self._held = []

    def close(self) -> None:
        self._closed.set()


def _place(rank: int, stage: NodeStage) -> Placed:
    import ray

    return Placed(rank, ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(),
                  socket.gethostname(), str(stage.root))


def train_loop(loop_config: dict[str, Any]) -> None:
    """One rank, inside a Ray Train worker (torch.distributed is set up by Ray Train)."""
    import ray.train

    from tunestudio.worker.optional import hide_unused

    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    events, commands = loop_config["events"], loop_config["commands"]
    stage = NodeStage(loop_config["run_id"])
    code = 1
    try:
        stage.enter(rank, loop_config["inputs"])
        events.put(_place(rank, stage))
        config = localise(loop_config["start"]["config"], [item for item, _ in loop_config["inputs"]], stage.root)
        # Decided from the node's own copy of the model (the studio's path may not exist here), before the
        # modelling libraries load (worker/optional.py).
        hide_unused(config)
        from tunestudio.worker.main import run

        homeward = None
        if rank == 0:
            storage = context.get_storage() if loop_config["storage"] else None
            homeward = Homeward(stage.output, events, storage)
        channel = RayRankChannel(rank, world_size, events, commands, homeward)
        try:
            code = run(config, channel, loop_config["start"]["secrets"])
            if rank == 0:
                channel.release()
        finally:
            channel.close()
    finally:
        stage.leave(rank)
    if code != 0:
        raise RuntimeError(f"rank {rank}: the job failed (its Failed event says why)")
