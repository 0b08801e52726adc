"""Which checkpoint a job resumes from: the newest *complete* one. Standard library only.

Both sides use this: the parent (the manager names a job's checkpoint, resume
picks it) and the worker (`resume_from_checkpoint: "latest"`). A checkpoint-N
folder is complete when its trainer state, its weights and its optimizer state
are all present and parse. A worker killed while saving leaves at most a
staging folder (the worker saves into one and renames it when done, see
worker/train/checkpointing.py) or, from an older version, a half-written folder: both
are skipped, so the previous checkpoint is the one used.

"Parse" is checked without torch: JSON for the state, the safetensors header
and length for safetensors weights, the zip directory (at the end of the file,
so a truncated file fails) for torch's .pt/.bin files.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import struct
import zipfile
from pathlib import Path

CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
TRAINER_STATE = "trainer_state.json"
OPTIMIZER = "optimizer.pt"
# Whole-model or adapter weights, in the formats the HF Trainer writes.
SAFETENSORS_WEIGHTS = ("adapter_model.safetensors", "model.safetensors")
INDEXED_WEIGHTS = ("model.safetensors.index.json", "adapter_model.safetensors.index.json")
PICKLED_WEIGHTS = ("adapter_model.bin", "pytorch_model.bin")


def _json_ok(path: Path) -> bool:
    try:
        return isinstance(json.loads(path.read_text(encoding="utf-8")), dict)
    except (OSError, ValueError):
        return False


def _safetensors_ok(path: Path) -> bool:
    """The header parses and the file is as long as the header says its data is."""
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            raw = fh.read(8)
            if len(raw) != 8:
                return False
            (length,) = struct.unpack("<Q", raw)
            if length > min(size - 8, 100_000_000):
                return False
            header = json.loads(fh.read(length))
        ends = [t["data_offsets"][1] for name, t in header.items() if name != "__metadata__"]
        return size >= 8 + length + max(ends, default=0)
    except (OSError, ValueError, KeyError, TypeError, IndexError, struct.error):
        return False


def _zip_ok(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as archive:
            return bool(archive.namelist())
    except (OSError, zipfile.BadZipFile, ValueError):
        return False


def _weights_ok(folder: Path) -> bool:
    for name in SAFETENSORS_WEIGHTS:
        if (folder / name).is_file():
            return _safetensors_ok(folder / name)
    for name in INDEXED_WEIGHTS:
        index = folder / name
        if index.is_file():
            try:
                shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                return False
            return bool(shards) and all(_safetensors_ok(folder / shard) for shard in shards)
    return any(_zip_ok(folder / name) for name in PICKLED_WEIGHTS if (folder / name).is_file())


def is_complete(path: str | Path) -> bool:
    """Whether a checkpoint folder holds a trainer state, weights and an optimizer state that all parse."""
    folder = Path(path)
    return (
        folder.is_dir()
        and _json_ok(folder / TRAINER_STATE)
        and _weights_ok(folder)
        and (folder / OPTIMIZER).is_file()
        and _zip_ok(folder / OPTIMIZER)
    )


def latest_checkpoint(output_dir: str | Path | None) -> str | None:
    """The complete checkpoint-N folder in output_dir with the highest N, or None."""
    if not output_dir:
        return None
    root = Path(output_dir)
    try:
        found = [(int(m.group(1)), p) for p in root.iterdir() if (m := CHECKPOINT.match(p.name))]
    except OSError:  # no such folder, or not one
        return None
    for _, path in sorted(found, reverse=True):
        if is_complete(path):
            return str(path)
    return None


def _fsync_tree(folder: Path) -> None:
    """Every file and the folder itself on disk before the rename makes them visible."""
    for path in folder.rglob("*"):
        if path.is_file():
            with path.open("rb") as fh:
                os.fsync(fh.fileno())
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(staged: Path, final: Path) -> None:
    """Move a finished checkpoint into place; an older copy at the same step is replaced only after."""
    _fsync_tree(staged)
    replaced = final.with_name(f".replaced-{final.name}")
    if final.exists():
        shutil.rmtree(replaced, ignore_errors=True)
        final.rename(replaced)
    staged.rename(final)
    shutil.rmtree(replaced, ignore_errors=True)
    fd = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


WEIGHT_FILES = ("*.safetensors", "adapter_model.bin", "pytorch_model*.bin", "adapter_config.json", "config.json")


def weights_files(folder: Path) -> list[Path]:
    """The files that hold a model's or an adapter's weights and config in `folder`."""
    return sorted({p for pattern in WEIGHT_FILES for p in folder.glob(pattern) if p.is_file()})


def fingerprint(folder: Path) -> str:
    """What the weights in `folder` are, as far as the file system tells: each file's name, size, mtime."""
    parts = []
    for path in weights_files(folder):
        with contextlib.suppress(OSError):
            stat = path.stat()
            parts.append(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}")
    return ";".join(parts)
