"""A job on a Ray cluster: the driver, `python -m tunestudio.worker.ray.job`, on the studio's machine.

The driver is a subprocess of the manager (jobs/ray_cluster.py), so the manager
never imports ray or torch. It takes the job over the same link as torchrun's
rank 0 (worker/rank.py: a token-checked Unix socket, the job as the first
line), connects to the cluster at TUNESTUDIO_RAY_ADDRESS, and runs Ray Train's
`TorchTrainer` with `num_processes` workers, each asking for
TUNESTUDIO_RAY_WORKER_RESOURCES; each runs the ordinary recipe
(worker/ray/rank.py). The cluster need not see this machine's files:

1. the job's local inputs go into the object store (worker/ray/ship.py), at
   most half the object store of this node, else the job fails before anything
   is shipped;
2. events and commands cross the cluster in two queues of one Ray actor
   (worker/ray/mailbox.py, an actor of this driver's job, on this node): rank 0
   puts events, the `Relay` numbers them,
   turns the node's paths back into the studio's and forwards them up the link;
   Stop commands go the other way;
3. what rank 0 sends back (checkpoints, then the artefacts; through the object
   store, or through Ray Train's storage at TUNESTUDIO_RAY_STORAGE) the Relay
   writes into the job's output_dir, the folder the manager took for the job;
   rank 0's end is forwarded after its files are written, preceded by a Log of
   where the ranks ran and how much was shipped each way.

The mailbox and the workers are the driver's: when it exits, however it exits,
Ray removes them.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from tunestudio.checkpoints import CHECKPOINT, publish
from tunestudio.events import Failed, Log, WarningEvent
from tunestudio.worker.child import die_with_parent
from tunestudio.worker.launch import RESULT_ENV
from tunestudio.worker.rank import MANAGER_PID_ENV, connect_link
from tunestudio.worker.ray.mailbox import open_boxes
from tunestudio.worker.ray.rank import train_loop
from tunestudio.worker.ray.ship import (
    STAGING,
    Ack,
    Input,
    PathMap,
    Placed,
    Returned,
    TooLarge,
    check_size,
    human,
    local_inputs,
    move_into,
    pack,
    resolve_latest,
    ship_limit,
    unpack,
)

ADDRESS_ENV = "TUNESTUDIO_RAY_ADDRESS"
RESOURCES_ENV = "TUNESTUDIO_RAY_WORKER_RESOURCES"
STORAGE_ENV = "TUNESTUDIO_RAY_STORAGE"
POLL_S = 0.2


class Relay:
    """Between the ranks and the supervisor: one numbering of the job's events, the studio's paths in them,
    and the files rank 0 sends back written into output_dir (in the order rank 0 sent them)."""

    def __init__(self, link: Any, output_dir: Path, world_size: int, inputs: list[Input],
                 storage: tuple[Any, str, str] | None = None) -> None:
        self.link = link
        self.output_dir = output_dir
        self.world_size = world_size
        self.inputs = inputs
        self.storage = storage  # (pyarrow filesystem, the run's folder on it, its URI)
        self.shipped_out = 0
        self.shipped_back = 0
        self.returned: list[str] = []  # what came back: "checkpoint-N", "the artefacts"
        self.ended = False  # rank 0's end went up
        self._seq = 0
        self._places: dict[int, Placed] = {}
        self._paths: PathMap | None = None
        self._written: set[str] = set()  # checkpoint folders this job wrote into output_dir

    # --- up the link -------------------------------------------------------------------
    def _up(self, line: str) -> None:
        with contextlib.suppress(OSError):
            self.link.sendall(line.encode() + b"\n")

    def emit(self, cls: type, **fields: Any) -> None:
        """An event of the driver's own (also on stderr, the job's log file)."""
        self._seq += 1
        event = cls(seq=self._seq, **fields)
        self._up(event.model_dump_json())
        level = {"log": getattr(event, "level", "info"), "warning": "warning", "failed": "error"}[event.kind]
        print(f"{time.strftime('%H:%M:%S')} [{level}] {event.message}", file=sys.stderr, flush=True)

    def _forward(self, line: str) -> None:
        if self._paths is not None:
            line = self._paths.text(line)
        event = json.loads(line)
        if event.get("kind") in ("completed", "failed"):
            self.emit(Log, message=self.summary())
            self.ended = True
        if event.get("kind") == "completed" and self.storage is not None:  # the job records where its files are
            event["storage"] = self.storage[2]
        self._seq += 1
        event["seq"] = self._seq
        self._up(json.dumps(event))

    # --- what the ranks send ---------------------------------------------------------------
    def handle(self, item: Any, commands: Any) -> None:
        if isinstance(item, str):
            for line in item.split("\n"):
                if line.strip():
                    self._forward(line)
        elif isinstance(item, Placed):
            self._placed(item)
        elif isinstance(item, Returned):
            try:
                self._returned(item)
            except Exception as exc:  # a file that could not be written: said; the final one fails the job
                self.emit(WarningEvent, message=f"ray: {item.name or 'the artefacts'} could not be written into "
                                                f"{self.output_dir}: {type(exc).__name__}: {exc}")
                if item.final:
                    commands.put(Ack(f"{type(exc).__name__}: {exc}"))
                return
            if item.final:
                commands.put(Ack())

    def _placed(self, place: Placed) -> None:
        self._places[place.rank] = place
        if place.rank == 0:
            self._paths = PathMap(place.stage, self.inputs, str(self.output_dir))
        if len(self._places) == self.world_size:
            self.emit(Log, message=f"ray: {self.placement()}")

    def placement(self) -> str:
        return "; ".join(f"rank {rank} on node {p.node_id[:12]} ({p.host}, {p.node_ip})"
                         for rank, p in sorted(self._places.items())) or "no rank started"

    def _returned(self, item: Returned) -> None:
        """Write a checkpoint (whole, then renamed into place) or the artefacts (merged into output_dir)."""
        if item.name and not CHECKPOINT.match(item.name):
            raise ValueError(f"not a checkpoint's name: {item.name!r}")
        staging = self.output_dir / STAGING / (item.name or "artefacts")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        if item.shipment is not None:
            self.shipped_back += unpack(item.shipment, staging)
        else:
            from ray.train import Checkpoint

            assert self.storage is not None and item.stored is not None
            filesystem, run_path, _ = self.storage
            Checkpoint(f"{run_path}/{item.stored}", filesystem=filesystem).to_directory(str(staging))
            self.shipped_back += item.size
        names = [p.relative_to(staging).as_posix() for p in staging.rglob("*") if p.is_file()]
        if self._paths is not None:
            self._paths.files(staging, names)
        if item.name:
            publish(staging, self.output_dir / item.name)
            self._written.add(item.name)
        else:
            move_into(staging, self.output_dir)
        with contextlib.suppress(OSError):
            (self.output_dir / STAGING).rmdir()
        self.returned.append(item.name or "the artefacts")
        for gone in self._written - set(item.present):  # the trainer rotated them away on the node
            shutil.rmtree(self.output_dir / gone, ignore_errors=True)
            self._written.discard(gone)

    def summary(self) -> str:
        """Where the ranks ran and how much was shipped each way (the Log before the job's end)."""
        back = f"{human(self.shipped_back)} back into {self.output_dir}"
        if self.storage is not None:
            back += f" from Ray Train's storage {self.storage[2]}"
        kinds = ", ".join(self.returned) if self.returned else "nothing"
        return (f"ray: {self.placement()}; shipped {human(self.shipped_out)} to the cluster through its object "
                f"store, {back} ({kinds})")


def _pump(events: Any, relay: Relay, commands: Any, done: threading.Event) -> None:
    """What the ranks put in the events queue, in order, until the job is done and the queue empty."""
    while True:
        try:
            item = events.get(block=True, timeout=POLL_S)
        except queue.Empty:
            if done.is_set():
                return
            continue
        except Exception:
            return  # the mailbox actor is gone
        try:
            relay.handle(item, commands)
        except Exception as exc:  # a malformed event: said, and the job goes on
            relay.emit(WarningEvent, message=f"ray: {type(exc).__name__}: {exc}")


def _forward_commands(link: Any, commands: Any) -> None:
    with contextlib.suppress(OSError, ValueError):
        for line in link.makefile("r", encoding="utf-8"):
            if line.strip():
                commands.put(line)


def _report(detail: str, whole: str = "") -> None:
    """The job's failure in the launcher's result file (Executor.exit_detail reads it), and all of it in the log."""
    result = os.environ.get(RESULT_ENV)
    if result:
        Path(result).write_text(json.dumps({"detail": f"ray: {detail[:500]}"}))
    print(f"ray job failed: {whole or detail}", file=sys.stderr, flush=True)


_SNIPPET = re.compile(r"\[Rank (\d+) Error Snippet\]")
_RAISED = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)): ?(.*)$")


def failure_cause(text: str) -> str:
    """Ray Train's failure in one line: its first line, then each failed rank with the exception it raised (the
    last `SomeError: message` line of that rank's snippet), e.g. "Training failed due to worker errors: rank 1
    raised ValueError: ..."; the first line alone where no rank's exception is found."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    raised: dict[str, str] = {}
    rank = None
    for line in lines[1:]:
        if match := _SNIPPET.search(line):
            rank = match.group(1)
        elif rank is not None and (error := _RAISED.match(line)):
            raised[rank] = f"{error.group(1)}: {error.group(2)}".rstrip(": ")
    head = lines[0].rstrip(":")
    if not raised:
        return lines[0]
    return f"{head}: " + "; ".join(f"rank {rank} raised {error}" for rank, error in raised.items())


def _object_store_bytes(ray: Any) -> float:
    here = ray.get_runtime_context().get_node_id()
    node = next((n for n in ray.nodes() if n.get("NodeID") == here), {})
    return float(node.get("Resources", {}).get("object_store_memory", 0))


def _missing_resources(ray: Any, wanted: dict[str, float]) -> list[str]:
    offered = ray.cluster_resources()
    return [name for name, amount in wanted.items() if amount > 0 and offered.get(name, 0) < amount]


def _storage(storage_uri: str | None, run_id: str) -> tuple[Any, str, str] | None:
    """Ray Train's storage for this run, where TUNESTUDIO_RAY_STORAGE names one: (filesystem, folder, URI)."""
    if not storage_uri:
        return None
    import pyarrow.fs

    filesystem, root = pyarrow.fs.FileSystem.from_uri(storage_uri)
    return (filesystem, f"{root.rstrip('/')}/tunestudio-{run_id}", f"{storage_uri.rstrip('/')}/"
            f"tunestudio-{run_id}")


def _ship(ray: Any, relay: Relay, inputs: list[Input], resources: dict[str, float] | None
          ) -> list[tuple[Input, Any]] | None:
    """The inputs, into the object store, and what the job will wait for said; None (a Failed sent) when they
    are too large, before anything is shipped."""
    try:
        total = check_size(inputs, ship_limit(_object_store_bytes(ray)))
    except TooLarge as exc:
        relay.emit(Failed, message=str(exc))
        return None
    shipped = [(item, pack(Path(item.path))) for item in inputs]
    relay.shipped_out = total
    if inputs:
        relay.emit(Log, message=f"ray: shipping {human(total)} to the cluster through its object store: " + ", ".join(
            f"{item.field} {item.path} ({human(shipment.size)})" for item, shipment in shipped))
    if resources and (missing := _missing_resources(ray, resources)):
        relay.emit(WarningEvent, message=f"ray: no node of the cluster offers {', '.join(missing)} now "
                   f"(TUNESTUDIO_RAY_WORKER_RESOURCES asks {json.dumps(resources)} per worker); the job waits "
                   "until one does (an autoscaler may add it): cancel it otherwise")
    if relay.storage is not None:
        relay.emit(Log, message=f"ray: checkpoints and artefacts are written to {relay.storage[2]} (Ray Train's "
                                f"storage) and copied into {relay.output_dir}")
    return shipped


def _open_queues(ray: Any, link: Any, relay: Relay) -> tuple[Any, Any, threading.Event, threading.Thread]:
    """The events and commands queues (one mailbox actor), on this node, with the threads that serve them."""
    here = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
        ray.get_runtime_context().get_node_id(), soft=False)
    options = {"num_cpus": 0, "scheduling_strategy": here}
    events, commands = open_boxes(ray, options)
    done = threading.Event()
    pump = threading.Thread(target=_pump, args=(events, relay, commands, done), daemon=True)
    pump.start()
    threading.Thread(target=_forward_commands, args=(link, commands), daemon=True).start()
    return events, commands, done, pump


def _scaling(ray: Any, num_processes: int, resources: dict[str, float] | None) -> Any:
    """Ray Train's ScalingConfig: the workers' resources as asked, else a GPU each where the cluster has enough."""
    if resources:
        return ray.train.ScalingConfig(num_workers=num_processes, use_gpu=resources.get("GPU", 0) > 0,
                                       resources_per_worker=resources)
    return ray.train.ScalingConfig(num_workers=num_processes,
                                   use_gpu=ray.cluster_resources().get("GPU", 0) >= num_processes)


def _fit(trainer: Any, relay: Relay, link: Any, done: threading.Event, pump: threading.Thread,
         bookkeeping: str | None) -> int:
    """Run Ray Train to its end, then drain the events, say the summary if no rank did, and clean up."""
    code = 0
    try:
        trainer.fit()
    except Exception as exc:  # Ray Train's TrainingFailedError and friends: say which worker and why
        code = 1
        _report(failure_cause(str(exc)) or type(exc).__name__, str(exc))
    finally:
        done.set()
        pump.join(timeout=60)
        if not relay.ended:  # no rank reported an end: where they ran and what was shipped, all the same
            relay.emit(Log, message=relay.summary())
        with contextlib.suppress(OSError):
            link.close()
        if bookkeeping:
            shutil.rmtree(bookkeeping, ignore_errors=True)
    return code


class PlainText:
    """A stream that writes its text without terminal colour codes. The driver's output is the job's log, a file
    the page and `jobs logs` show as text; Ray colours what it prints there: each line's "(RayTrainWorker pid=...)"
    prefix and the "[repeated Nx across cluster]" note of the lines it deduplicates (RAY_COLOR_PREFIX=0 would
    reach only the first).

    With `drop` set (a pattern), whole lines that match it are left out. Ray prints a line in two writes (the
    text, then its end), so a thread's text is kept until its line is complete, each thread's apart: Ray's log
    thread and the driver's own threads write here at once."""

    CODES = re.compile(r"\x1b\[[0-9;]*m")

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.drop: re.Pattern[str] | None = None
        self._pending: dict[int, str] = {}  # by thread: its line so far
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        thread = threading.get_ident()
        with self._lock:
            held = self._pending.pop(thread, "")
            if self.drop is None and not held:
                self._stream.write(self.CODES.sub("", text))
                return len(text)
            *lines, rest = (held + text).split("\n")
            for line in lines:
                self._line(line + "\n")
            if rest:
                self._pending[thread] = rest
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def _line(self, line: str) -> None:
        line = self.CODES.sub("", line)
        if self.drop is None or not self.drop.search(line):
            self._stream.write(line)

    def flush(self) -> None:
        """This thread's text so far, then the stream's buffer (another thread's unfinished line waits)."""
        with self._lock:
            held = self._pending.pop(threading.get_ident(), "")
            if held:
                self._line(held)
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding...: the stream's own
        return getattr(self._stream, name)


# Ray Train's placement-group cleaner (a detached actor of each run) asks Ray's state API, which the cluster's
# dashboard serves, whether the run's controller lives, every second. A cluster without a dashboard (a head
# started with --include-dashboard=false, or without Ray's dashboard packages: `ray[default]`) answers none of
# those questions, and the cleaner warns each time: half the lines of a short job's log. (Matched with Ray's
# prefix of the cleaner's lines, which RAY_DISABLE_WORKER_LOG_PREFIX=1 would take away.)
BLIND_CLEANER = re.compile(r"PlacementGroupCleaner pid=.*State API may be temporarily unavailable")
NO_DASHBOARD = ("ray: the cluster runs no dashboard, so Ray Train's placement-group cleaner cannot see this run's "
                "controller (Ray's state API): its warning about that, every second, is left out of this log. A "
                "cancel stops the cleaner with the run; a driver killed outright (SIGKILL) leaves it running "
                "until the cluster stops. Start the head node with Ray's dashboard (pip install 'ray[default]') "
                "for Ray's own clean-up.")
# How long a SIGTERM'd driver waits for its run's abort: under the supervisor's SIGKILL, `kill_after_seconds`
# (5 s by default) after the SIGTERM. The abort stops the cleaner first; its wait for the ranks to shut down
# (up to 5 s each) may be cut short: the ranks end with the driver anyway.
ABORT_S = 3.0
_terminated = threading.Event()


def _terminate(signum: int, frame: Any) -> None:
    """SIGTERM (the supervisor's, when a stop's grace period is over) taken as Ray Train takes Ctrl-C in its
    driver: the handler `fit` installed has the run's controller abort (its cleaner stopped, its workers killed,
    its placement group removed), for at most ABORT_S, in a thread of its own (it waits on the controller). Then
    the driver exits with the signal's number (`__main__`), through its `finally`s (not Ray's shutdown), as
    ray.init's own handler (a plain sys.exit, which left the run's detached cleaner behind: on a cluster without
    a dashboard, for good) meant to. A second SIGTERM changes nothing."""
    if _terminated.is_set():
        return
    _terminated.set()
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler) and handler is not signal.default_int_handler:  # Ray Train's: `fit` set it
        abort = threading.Thread(target=handler, args=(signal.SIGINT, frame), name="abort", daemon=True)
        abort.start()
        abort.join(ABORT_S)
    raise SystemExit(signum)


def main() -> int:
    die_with_parent(int(os.environ[MANAGER_PID_ENV]))
    streams = PlainText(sys.stdout), PlainText(sys.stderr)
    sys.stdout, sys.stderr = streams  # type: ignore[assignment]  # Ray prints its processes' lines there
    signal.signal(signal.SIGTERM, _terminate)
    link, start = connect_link()
    import ray
    import ray.train
    import ray.train.torch
    import ray.util.scheduling_strategies

    address = os.environ.get(ADDRESS_ENV) or "auto"
    try:
        cluster = ray.init(address=address, logging_level="WARNING")
    except Exception as exc:
        _report(f"cannot join the cluster at {address}: {exc}")
        return 1
    signal.signal(signal.SIGTERM, _terminate)  # again: ray.init put its own in place
    config = resolve_latest(start["config"])
    start = {**start, "config": config}
    output_dir = Path(config["output_dir"])
    num_processes = int(config.get("num_processes", 1))
    resources = json.loads(os.environ.get(RESOURCES_ENV) or "null")
    storage_uri = os.environ.get(STORAGE_ENV) or None
    run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"
    inputs = local_inputs(config)
    storage = _storage(storage_uri, run_id)
    relay = Relay(link, output_dir, num_processes, inputs, storage)
    if not cluster.dashboard_url:
        for stream in streams:
            stream.drop = BLIND_CLEANER
        relay.emit(WarningEvent, message=NO_DASHBOARD)

    # 1. the inputs, into the object store (or a clear refusal before anything is shipped)
    shipped = _ship(ray, relay, inputs, resources)
    if shipped is None:
        link.close()
        return 1
    # 2. the queues, on this node
    events, commands, done, pump = _open_queues(ray, link, relay)
    # 3. Ray Train: without a storage URI, its bookkeeping stays in a temporary folder on this machine (its
    # controller runs here; the ranks never write to it)
    scaling = _scaling(ray, num_processes, resources)
    bookkeeping = None if storage_uri else tempfile.mkdtemp(prefix="tunestudio-ray-train-")
    trainer = ray.train.torch.TorchTrainer(
        train_loop,
        train_loop_config={"start": start, "events": events, "commands": commands, "inputs": shipped,
                           "run_id": run_id, "storage": storage is not None},
        scaling_config=scaling,
        run_config=ray.train.RunConfig(name=f"tunestudio-{run_id}", storage_path=storage_uri or bookkeeping),
    )
    return _fit(trainer, relay, link, done, pump, bookkeeping)


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        if _terminated.is_set():
            # The signal's number (ray.init's handler's code), whatever Ray's wait made of the exit raised inside it
            # (code 1), and now, after the `finally`s above: an abort still under way past ABORT_S that touched Ray
            # during its shutdown at exit had Ray's core worker end the process with code 1 ("The core worker has
            # already been shutdown"), seen once in the cluster test. The run was aborted and the job's files and
            # events are done with; the cluster ends what this driver owned when it is gone.
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(signal.SIGTERM.value)
