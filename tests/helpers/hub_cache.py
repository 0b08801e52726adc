"""A hub dataset in a local `datasets` cache, as `load_dataset` leaves it after a download, with no hub at all:
`datasets`' own JSON builder fills the cache from local files under the hub id's name (as in
tests/worker/test_data.py's hub test), so `load_dataset("org/name")` reads it with HF_HUB_OFFLINE."""

from __future__ import annotations

import json
from pathlib import Path

from .planted import Planted


def cache_hub_dataset(cache: Path, hub_id: str, splits: dict[str, Path], subset: str = "default") -> None:
    """Put `splits` (split name → a JSON Lines file) in the cache at `cache` as the hub dataset `hub_id`.

    A process reads it when HF_DATASETS_CACHE is `cache` (the environment of a child, or datasets.config in this
    process) and the hub is out of reach (HF_ENDPOINT to a closed port)."""
    from datasets.packaged_modules.json.json import Json

    org, name = hub_id.split("/")
    builder = Json(cache_dir=str(cache), data_files={split: str(path) for split, path in splits.items()},
                   dataset_name=f"{org}___{name}", config_name=subset, config_id=subset, hash="0")
    builder.download_and_prepare()
    for path in Path(builder.cache_dir).glob(f"{org}___*.arrow"):  # the file names a download gives
        path.rename(path.with_name(path.name.removeprefix(f"{org}___")))


def hub_planted(planted: Planted, cache: Path, hub_id: str = "someorg/planted") -> None:
    """The planted rows as a hub dataset in the cache: train (without the malformed line, which the builder cannot
    read: the file's line 48, after every row the eval overlap names) and test (the eval file)."""
    readable = [line for line in planted.train.read_text().splitlines() if _parses(line)]
    train = planted.train.with_name("hub-train.jsonl")
    train.write_text("\n".join(readable) + "\n", encoding="utf-8")
    cache_hub_dataset(cache, hub_id, {"train": train, "test": planted.eval})


def _parses(line: str) -> bool:
    try:
        json.loads(line)
    except json.JSONDecodeError:
        return False
    return True
