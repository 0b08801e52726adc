"""What a model folder holds, read from its files alone (config.json, safetensors headers): no torch.

Used by the model picker (local folders under the model roots, hub ids in the local cache)
and by the estimate before Start (tunestudio/api/estimate.py).
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tunestudio.paths import expand

WEIGHTS = ("*.safetensors", "*.bin", "*.pt", "*.gguf")
_SKIP = {".git", ".venv", "node_modules", "__pycache__", ".cache", "site-packages", "checkpoints"}
MAX_DEPTH = 4
MAX_DIRS = 4000  # a model root may be a big tree (the cwd): the scan stops here rather than stall the page


def hub_cache() -> Path:
    hub = os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", "~/.cache/huggingface")) / "hub"
    return expand(hub)


def read_config(folder: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def safetensors_parameters(folder: Path) -> int | None:
    """The exact parameter count from the safetensors headers (8-byte length, then JSON), or None."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    try:
        for path in files:
            with path.open("rb") as handle:
                (length,) = struct.unpack("<Q", handle.read(8))
                if length > 100_000_000:
                    return None
                header = json.loads(handle.read(length))
            for name, tensor in header.items():
                if name == "__metadata__":
                    continue
                count = 1
                for dim in tensor["shape"]:
                    count *= int(dim)
                total += count
    except (OSError, ValueError, KeyError, struct.error):
        return None
    return total


def folder_bytes(folder: Path) -> int:
    total = 0
    for path in folder.iterdir():
        try:
            if path.is_file():
                total += path.stat().st_size
        except OSError:
            continue
    return total


def describe(folder: Path, config: dict[str, Any] | None = None) -> dict[str, Any]:
    config = config if config is not None else read_config(folder) or {}
    archs = config.get("architectures") or []
    return {
        "path": str(folder), "name": folder.name, "bytes": folder_bytes(folder),
        "architecture": archs[0] if archs else None, "model_type": config.get("model_type"),
        "parameters": safetensors_parameters(folder),
    }


def _is_model(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(next(folder.glob(p), None) for p in WEIGHTS)


def local_models(roots: list[Path]) -> Iterator[Path]:
    """Model folders (config.json and weights) under the roots, breadth first, bounded in depth and count."""
    seen: set[Path] = set()
    cache = hub_cache().resolve()
    visited = 0
    queue = [(root, 0) for root in roots if root.is_dir()]
    while queue and visited < MAX_DIRS:
        folder, depth = queue.pop(0)
        try:
            real = folder.resolve()
        except OSError:
            continue
        if real in seen:
            continue
        seen.add(real)
        visited += 1
        if real == cache:
            continue  # the hub cache is listed by hub id (cached_hub_models), not by snapshot folder
        if _is_model(folder):
            yield folder
            continue
        if depth >= MAX_DEPTH:
            continue
        try:
            children = sorted(p for p in folder.iterdir() if p.is_dir() and p.name not in _SKIP
                              and not p.name.startswith("."))
        except OSError:
            continue
        queue.extend((child, depth + 1) for child in children)


def cached_snapshot(hub_id: str) -> Path | None:
    """The newest snapshot folder of a hub model in the local cache that has a config.json."""
    repo = hub_cache() / f"models--{hub_id.replace('/', '--')}"
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    ref = repo / "refs" / "main"
    if ref.is_file():
        folder = snapshots / ref.read_text().strip()
        if (folder / "config.json").is_file():
            return folder
    found = sorted((p for p in snapshots.iterdir() if (p / "config.json").is_file()),
                   key=lambda p: p.stat().st_mtime, reverse=True)
    return found[0] if found else None


def cached_hub_models() -> list[str]:
    cache = hub_cache()
    if not cache.is_dir():
        return []
    out = []
    for repo in sorted(cache.glob("models--*")):
        hub_id = repo.name.removeprefix("models--").replace("--", "/")
        if cached_snapshot(hub_id) is not None:
            out.append(hub_id)
    return out
