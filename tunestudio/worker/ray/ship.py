"""Files between the studio's machine and a Ray cluster that shares no disk with it, through Ray's object store.

Both ends of a Ray job use it (worker/ray/job.py, the driver on the studio's
machine; worker/ray/rank.py, each rank on its node):

- to the cluster: the job's local inputs (`local_inputs`: a local model folder,
  dataset files and folders, an eval file, reward function files, the
  checkpoint a resume continues from), each file cut into `CHUNK_BYTES` pieces
  put into the object store by the driver (`pack`), fetched and written on
  every node that runs a rank (`unpack`), under the node's own temporary folder;
- back: what rank 0 writes into its node's output folder (checkpoints as they
  are completed, then the artefacts), packed by rank 0 and written by the
  driver into the job's output_dir (`unpack`), or, with a storage URI, written
  through Ray Train's storage and copied from there;
- the limit: the inputs may take half the object store of the driver's node
  (`ship_limit`); past it the job fails before anything is shipped
  (`TooLarge`), naming what it would ship.

Paths: a rank runs the recipe on node-local copies (`node_path`), so what it
writes mentions them; `PathMap` turns them back into the studio's paths in
events and in the JSON and Markdown files that come back (adapter_config.json's
base model, job_config.json, trainer_state.json, the model card).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunestudio import ownership
from tunestudio.checkpoints import CHECKPOINT, latest_checkpoint
from tunestudio.config import reward_model_folder, reward_source

CHUNK_BYTES = 64 << 20  # one object per 64 MiB of a file: bounded memory on both ends
STAGING = ".checkpoint-staging"  # as worker/train/checkpointing.py names it: never taken for a checkpoint
REWRITTEN = (".json", ".md")  # files whose node-local paths are turned back into the studio's
REWRITE_MAX_BYTES = 16 << 20
NOT_SHIPPED = {ownership.MARKER, f"{ownership.MARKER}.tmp", STAGING}


@dataclass
class ShippedFile:
    path: str  # relative, POSIX
    size: int
    mode: int
    chunks: list[Any]  # ObjectRefs, in order


@dataclass
class Shipment:
    """Files in the object store, and how to write them back."""

    files: list[ShippedFile] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


@dataclass(frozen=True)
class Input:
    """One local path the job reads: a config field and the studio's absolute path, a file or a folder."""

    field: str
    path: str
    folder: bool = False

    def node_folder(self, stage: str | Path, index: int) -> Path:
        """Where its shipment is unpacked on a node: the folder itself, or the folder a file lies in."""
        where = Path(node_path(stage, index, self.path))
        return where if self.folder else where.parent


@dataclass
class Placed:
    """A rank's place, sent to the driver once its inputs are staged: which node, and its stage folder."""

    rank: int
    node_id: str
    node_ip: str
    host: str
    stage: str


@dataclass
class Returned:
    """Rank 0 to the driver: a checkpoint (name "checkpoint-N") or the artefacts (name ""), as a shipment
    through the object store or, with a storage URI, stored in Ray Train's storage under `stored`.

    present: the checkpoint folders rank 0's node still holds (the trainer rotates them): the driver removes
    those it brought back earlier and the node no longer has. final: the last one; the driver acknowledges it.
    """

    name: str
    shipment: Shipment | None = None
    stored: str | None = None
    size: int = 0
    present: list[str] = field(default_factory=list)
    final: bool = False


@dataclass(frozen=True)
class Ack:
    """The driver to rank 0: the final `Returned` is written (error: why it is not); rank 0 may report its end."""

    error: str | None = None


class TooLarge(ValueError):
    """The job's local inputs exceed what the driver ships through the object store."""


# --- what a job reads ------------------------------------------------------------------
def local_inputs(config: dict[str, Any]) -> list[Input]:
    """The local paths of a resolved config (absolute, as `paths.resolve` left them) that exist on this machine.

    A hub id (model or dataset) is not a path: the cluster fetches it itself. "latest" must be resolved first
    (`resolve_latest`).
    """
    found: list[Input] = []

    def add(field_name: str, raw: str | None) -> None:
        if raw and os.path.isabs(raw) and os.path.exists(raw):
            found.append(Input(field_name, raw, os.path.isdir(raw)))

    add("model_name", config.get("model_name"))
    for raw in config.get("local_datasets") or []:
        add("local_datasets", raw)
    add("hf_dataset", config.get("hf_dataset"))
    add("eval_split", config.get("eval_split"))
    for entry in config.get("reward_functions") or []:
        add("reward_functions", reward_model_folder(entry) or reward_source(entry))
    if config.get("resume_from_checkpoint") != "latest":
        add("resume_from_checkpoint", config.get("resume_from_checkpoint"))
    add("held_out_rows", config.get("held_out_rows"))
    return found


def resolve_latest(config: dict[str, Any]) -> dict[str, Any]:
    """`resume_from_checkpoint: "latest"` is the newest complete checkpoint in output_dir on *this* machine (the
    node's output folder starts empty); unchanged when there is none (the worker then says so)."""
    if config.get("resume_from_checkpoint") != "latest" or not config.get("output_dir"):
        return config
    found = latest_checkpoint(config["output_dir"])
    return {**config, "resume_from_checkpoint": found} if found else config


def node_path(stage: str | Path, index: int, original: str) -> str:
    """Where input `index` lies on a node: under the node's stage folder, with its own name."""
    return str(Path(stage) / "inputs" / str(index) / (Path(original).name or "input"))


def node_output(stage: str | Path) -> str:
    return str(Path(stage) / "output")


def localise(config: dict[str, Any], inputs: list[Input], stage: str | Path) -> dict[str, Any]:
    """The config a rank runs: every shipped input at its node path, the output folder in the stage."""
    where = {item.path: node_path(stage, i, item.path) for i, item in enumerate(inputs)}
    out = dict(config)
    for name in ("model_name", "hf_dataset", "eval_split", "resume_from_checkpoint", "held_out_rows"):
        if out.get(name) in where:
            out[name] = where[out[name]]
    out["local_datasets"] = [where.get(raw, raw) for raw in out.get("local_datasets") or []]
    rewards = []
    for entry in out.get("reward_functions") or []:
        source, folder = reward_source(entry), reward_model_folder(entry)
        if folder in where:
            rewards.append(f"model:{where[folder]}")
        else:
            rewards.append(f"{where[source]}:{entry.rpartition(':')[2]}" if source in where else entry)
    out["reward_functions"] = rewards
    out["output_dir"] = node_output(stage)
    return out


# --- the limit ----------------------------------------------------------------------------
def ship_limit(object_store_bytes: float) -> int:
    """Half the object store of the driver's node: the inputs stay there until the job ends, and the other half
    is room for what comes back."""
    return int(object_store_bytes) // 2


def check_size(inputs: list[Input], limit: int) -> int:
    """The inputs' total size; raises TooLarge naming each input when it is over `limit`."""
    sizes = [(item, sum(size for _, size in _files(Path(item.path)))) for item in inputs]
    total = sum(size for _, size in sizes)
    if total > limit:
        listed = ", ".join(f"{item.field} {item.path} ({human(size)})" for item, size in sizes)
        raise TooLarge(
            f"the job's local inputs take {human(total)} ({listed}); a Ray cluster without a shared disk gets "
            f"them through the object store of the studio's node, which ships at most half its size "
            f"({human(limit)}). Name the model by its hub id or put the data where the cluster reads it, or give "
            "that node a larger --object-store-memory")
    return total


def human(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"


# --- packing and unpacking -----------------------------------------------------------------
def _files(root: Path) -> Iterator[tuple[str, int]]:
    """(relative POSIX path, size) of every file under root (or root itself), following symlinks (a hub-cache
    snapshot is links to blobs), each real folder once; `NOT_SHIPPED` names are left out."""
    if root.is_file():
        yield root.name, root.stat().st_size
        return
    seen: set[str] = set()
    for folder, subfolders, names in os.walk(root, followlinks=True):
        real = os.path.realpath(folder)
        if real in seen:
            subfolders[:] = []
            continue
        seen.add(real)
        subfolders[:] = sorted(d for d in subfolders if d not in NOT_SHIPPED)
        for name in sorted(names):
            path = Path(folder, name)
            if name not in NOT_SHIPPED and path.is_file():
                yield path.relative_to(root).as_posix(), path.stat().st_size


def pack(root: Path, only: Iterable[str] | None = None) -> Shipment:
    """Put the files under root (a folder, or one file) into the object store; `only`: these relative paths."""
    import numpy as np
    import ray

    names = list(only) if only is not None else [name for name, _ in _files(root)]
    shipment = Shipment()
    for name in names:
        path = root if root.is_file() else root / name
        chunks = []
        with path.open("rb") as fh:
            while piece := fh.read(CHUNK_BYTES):
                chunks.append(ray.put(np.frombuffer(piece, dtype=np.uint8)))
        info = path.stat()
        shipment.files.append(ShippedFile(name if not root.is_file() else root.name, info.st_size,
                                          stat.S_IMODE(info.st_mode), chunks))
    return shipment


def unpack(shipment: Shipment, dest: Path) -> int:
    """Write the shipment's files under dest, each whole or not at all (a temporary name, then a rename);
    returns the bytes written."""
    import ray

    written = 0
    for item in shipment.files:
        if Path(item.path).is_absolute() or ".." in Path(item.path).parts:
            raise ValueError(f"refusing to write {item.path!r} outside {dest}")
        target = dest / item.path
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.incoming")
        with partial.open("wb") as fh:
            for ref in item.chunks:
                fh.write(memoryview(ray.get(ref)))  # a zero-copy view of the object store's copy
        os.chmod(partial, item.mode)
        os.replace(partial, target)
        written += item.size
    return written


def shippable(output: Path) -> tuple[list[str], list[str]]:
    """What rank 0's output folder holds to send back: (complete checkpoint folders, other files relative to
    output), the ownership marker and a half-written checkpoint left out."""
    from tunestudio.checkpoints import is_complete

    checkpoints, files = [], []
    if not output.is_dir():
        return [], []
    for entry in sorted(output.iterdir()):
        if CHECKPOINT.match(entry.name) and entry.is_dir():
            if is_complete(entry):
                checkpoints.append(entry.name)
        elif entry.name not in NOT_SHIPPED and not entry.name.startswith(".replaced-"):
            files += [entry.name] if entry.is_file() else [f"{entry.name}/{n}" for n, _ in _files(entry)]
    return checkpoints, files


def move_into(source: Path, dest: Path) -> None:
    """Merge the files of source into dest, each replacing a file of the same name (as a local job writes over
    its folder's files); source is emptied."""
    for folder, _, names in os.walk(source):
        for name in names:
            src = Path(folder, name)
            target = dest / src.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, target)
    shutil.rmtree(source, ignore_errors=True)


# --- node paths back to the studio's --------------------------------------------------------
class PathMap:
    """Node-local paths (of rank 0's node) to the studio's: the inputs' copies and the output folder."""

    def __init__(self, stage: str, inputs: list[Input], output_dir: str) -> None:
        pairs = [(node_path(stage, i, item.path), item.path) for i, item in enumerate(inputs)]
        pairs.append((node_output(stage), output_dir))
        # Longest first, JSON-escaped on both sides: the replacement is made in JSON text.
        self._pairs = sorted(((json.dumps(a)[1:-1], json.dumps(b)[1:-1]) for a, b in pairs),
                             key=lambda pair: -len(pair[0]))

    def text(self, text: str) -> str:
        for node, studio in self._pairs:
            text = text.replace(node, studio)
        return text

    def files(self, folder: Path, names: Iterable[str]) -> None:
        """Rewrite, in place, the JSON and Markdown files among `names` (relative to folder)."""
        for name in names:
            path = folder / name
            if path.suffix not in REWRITTEN or not path.is_file() or path.stat().st_size > REWRITE_MAX_BYTES:
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            new = self.text(text)
            if new != text:
                partial = path.with_name(f".{path.name}.rewritten")
                partial.write_text(new, encoding="utf-8")
                os.chmod(partial, stat.S_IMODE(path.stat().st_mode))
                os.replace(partial, path)
