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

from tunestudio.estimate_vision import pixel_cap
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


def read_shape(folder: Path) -> dict[str, Any] | None:
    """config.json with what the estimate needs of the processor's files beside it: a vision model's pixel cap
    (Qwen2-VL's family: `_max_pixels`, tunestudio.estimate.image_job reads it). None without a config.json."""
    config = read_config(folder)
    if config is None or not isinstance(config.get("vision_config"), dict):
        return config
    for name in ("processor_config.json", "preprocessor_config.json"):
        try:
            cap = pixel_cap(json.loads((folder / name).read_text()))
        except (OSError, ValueError):
            continue
        if cap is not None:
            return {**config, "_max_pixels": cap}
    return config


class BadWeights(ValueError):
    """A safetensors file whose header cannot be read: the message names the file and the fault."""


MAX_HEADER_BYTES = 100_000_000
MAX_PARAMETERS = 10**15  # over a thousand times today's largest models: a header claiming more is garbage


def safetensors_parameters(folder: Path) -> int | None:
    """The exact parameter count from the safetensors headers (8-byte length, then JSON); None when the folder has
    no safetensors file. Raises BadWeights for a file that is not one, truncated, or whose header makes no sense."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    return sum(_file_parameters(path) for path in files)


def _file_parameters(path: Path) -> int:
    def bad(why: str) -> BadWeights:
        return BadWeights(f"{path.name}: {why}")

    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            raw = handle.read(8)
            if len(raw) < 8:
                raise bad(f"{size} bytes, too short for a safetensors header")
            (length,) = struct.unpack("<Q", raw)
            if length > min(size - 8, MAX_HEADER_BYTES):
                raise bad(f"the header says it is {length} bytes long and the file holds {size - 8} after that: "
                          "truncated, or not a safetensors file")
            header = json.loads(handle.read(length))
    except OSError as exc:
        raise bad(f"cannot be read ({exc.strerror or type(exc).__name__})") from None
    except (ValueError, RecursionError):
        raise bad("the header is not JSON: not a safetensors file, or a damaged one") from None
    if not isinstance(header, dict):
        raise bad("the header is not a JSON object: not a safetensors file, or a damaged one")
    total = end = 0
    for name, tensor in header.items():
        if name == "__metadata__":
            continue
        shape = tensor.get("shape") if isinstance(tensor, dict) else None
        offsets = tensor.get("data_offsets") if isinstance(tensor, dict) else None
        if (not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape)
                or not isinstance(offsets, list) or len(offsets) != 2
                or not all(type(o) is int and o >= 0 for o in offsets)):
            raise bad(f"the header's entry {str(name)[:80]!r} is not a tensor (a shape and two data offsets)")
        count = 0 if 0 in shape else 1
        for dim in shape if count else ():
            count *= dim
            if count > MAX_PARAMETERS:
                break
        total += count
        if total > MAX_PARAMETERS:
            raise bad(f"the header's shapes add up to over {MAX_PARAMETERS:.0e} parameters")
        end = max(end, offsets[1])
    if size < 8 + length + end:
        raise bad(f"truncated: its tensors end at byte {8 + length + end} and the file has {size} bytes")
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
    try:
        parameters, error = safetensors_parameters(folder), None
    except BadWeights as exc:  # listed anyway, with the reason: the picker still shows the other models
        parameters, error = None, str(exc)
    return {
        "path": str(folder), "name": folder.name, "bytes": folder_bytes(folder),
        "architecture": archs[0] if archs else None, "model_type": config.get("model_type"),
        "parameters": parameters, "error": error,
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
