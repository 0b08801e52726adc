"""Reading a `datasets` dataset's rows (a hub id, read from the local cache first; a cached hub dataset; or a
folder written by `save_to_disk`): `sources.open_rows` for a job or report with `hf_dataset`."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

from tunestudio.config import JobConfig, ReportSpec
from tunestudio.paths import expand
from tunestudio.worker import hub
from tunestudio.worker.data.rows import Opened, Row, Stream
from tunestudio.worker.errors import UserError


def _saved_by_datasets(path: Path) -> bool:
    return (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()


def _from_disk(cfg: JobConfig | ReportSpec, path: Path, split: str) -> Any:
    from datasets import DatasetDict, load_from_disk

    loaded = load_from_disk(str(path))
    if isinstance(loaded, DatasetDict):
        if split not in loaded:
            raise UserError(f"dataset {cfg.hf_dataset!r} has no split {split!r}; it has {sorted(loaded)}")
        return loaded[split]
    if split != cfg.train_split:
        raise UserError(f"dataset {cfg.hf_dataset!r} was saved as a single dataset without splits; "
                        f"it has no split {split!r}")
    return loaded


def _load(cfg: JobConfig | ReportSpec, split: str) -> Any:
    """One split through `datasets.load_dataset`: the local cache first, then the hub if it answers."""
    import datasets

    name = cfg.hf_dataset or ""
    token = cfg.hf_token.get_secret_value() if cfg.hf_token else None
    kwargs: dict[str, Any] = {"name": cfg.subset, "split": split, "token": token}
    try:
        if expand(name).exists() or hub.looks_like_local_path(name):
            return datasets.load_dataset(str(expand(name)), **kwargs)
        online = datasets.config.HF_HUB_OFFLINE
        try:
            datasets.config.HF_HUB_OFFLINE = True  # the cache alone: no network, no retries
            return datasets.load_dataset(name, **kwargs)
        except (ConnectionError, FileNotFoundError):
            pass  # not cached: ask the hub
        finally:
            datasets.config.HF_HUB_OFFLINE = online
        hub.require_hub("dataset", name)
        return datasets.load_dataset(name, **kwargs)
    except UserError:
        raise
    except ValueError as exc:  # unknown split or subset
        raise UserError(f"dataset {name!r} (subset {cfg.subset!r}, split {split!r}): {exc}") from None
    except (ConnectionError, FileNotFoundError, datasets.exceptions.DatasetNotFoundError) as exc:
        raise UserError(f"dataset {name!r}: cannot load it: {exc}") from None


def _undecoded(dataset: Any) -> Any:
    """The dataset with its `Audio` columns left encoded ({"bytes", "path"}): `datasets` would decode them with
    torchcodec (FFmpeg's libraries); worker/data/audio.py decodes them with soundfile instead."""
    from datasets import Audio

    features = getattr(dataset, "features", None) or {}
    for name, feature in features.items():
        if isinstance(feature, Audio) and feature.decode:
            dataset = dataset.cast_column(name, Audio(decode=False))
    return dataset


def _dataset_rows(source: str, dataset: Any) -> Iterator[Row]:
    dataset = _undecoded(dataset)
    for number, item in enumerate(dataset, start=1):
        yield Row(source, number, dict(item))


def open_hub(cfg: JobConfig | ReportSpec) -> Opened:
    name = cfg.hf_dataset or ""
    path = expand(name)
    load = (lambda split: _from_disk(cfg, path, split)) if path.is_dir() and _saved_by_datasets(path) else (
        lambda split: _load(cfg, split))
    train = Stream((partial(_dataset_rows, f"{name}[{cfg.train_split}]", load(cfg.train_split)),))
    evals = Stream((partial(_dataset_rows, f"{name}[{cfg.eval_split}]", load(cfg.eval_split)),)) if cfg.eval_split \
        else None
    subset = f", subset {cfg.subset}" if cfg.subset else ""
    return Opened(train, evals, f"{name} (split {cfg.train_split}{subset})",
                  f"dataset {name!r} split {cfg.train_split!r} is empty: no rows to train on")
