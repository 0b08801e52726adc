"""Reading rows from where the user keeps them: local files and folders, or a
`datasets` dataset (a hub id, a cached hub dataset, or a folder written by
`save_to_disk`).

File-level problems (no such format, not UTF-8, an unreadable file, a Parquet
decompression bomb) raise a UserError at once. Row-level problems (a malformed
JSON line, a row that is not an object) become a `Row` with a `problem`, so the
caller can drop and count it.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunestudio.config import JobConfig, ReportSpec
from tunestudio.paths import expand
from tunestudio.worker import hub
from tunestudio.worker.errors import UserError

SUPPORTED_SUFFIXES = (".json", ".jsonl", ".csv", ".parquet")

# Parquet decompression bombs: what is bounded is what a file decodes to, not its size (2 KB of zstd held 1 GB
# of rows). Before anything is decoded, a column chunk whose pages decompress to more than
# PARQUET_MAX_EXPANSION times their stored bytes (once past PARQUET_JUDGED_FROM) is refused, as its metadata
# says. Strings are then read with their dictionaries kept (a dictionary page can repeat one long string in every
# row, which no size in the metadata shows), and the rows are refused before they are decoded past
# PARQUET_MAX_EXPANSION times the file's size, or PARQUET_FREE_BYTES for a small file.
PARQUET_MAX_EXPANSION = 100
PARQUET_JUDGED_FROM = 1 << 20
PARQUET_FREE_BYTES = 256 << 20
_AS_JSONL = "if the rows are real, save them as JSON Lines"


@dataclass
class Row:
    source: str
    number: int  # 1-based: the line (JSONL, CSV) or the position (JSON list, Parquet, hub)
    data: dict[str, Any] | None
    problem: str | None = None  # set when the row could not be read

    def where(self) -> str:
        return f"dataset {self.source} row {self.number}"


@dataclass
class Rows:
    """The rows to train on, and the explicit eval rows if an eval split was named."""

    train: list[Row]
    eval: list[Row] | None
    description: str  # what was read, for the user


# --- local files ----------------------------------------------------------------
def _split_of(path: Path, split: str) -> bool:
    """Whether a file belongs to a named split by the `datasets` convention (test.jsonl, test-00000.parquet)."""
    stem = path.name.split(".")[0]
    return stem == split or stem.startswith((f"{split}-", f"{split}_"))


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        found = sorted(p for p in path.rglob("*") if p.suffix.lower() in SUPPORTED_SUFFIXES and p.is_file())
        if not found:
            raise UserError(f"dataset folder {path} holds no {', '.join(SUPPORTED_SUFFIXES)} files")
        return found
    if path.suffix.lower() not in SUPPORTED_SUFFIXES:
        raise UserError(f"dataset {path}: unsupported file type {path.suffix!r}; use {', '.join(SUPPORTED_SUFFIXES)}")
    return [path]


def _read_text(path: Path) -> str:
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise UserError(
            f"dataset {path} row {line} is not valid UTF-8 (byte offset {exc.start}); save the file as UTF-8"
        ) from None


def _object_row(path: Path, number: int, item: Any) -> Row:
    if isinstance(item, dict):
        return Row(str(path), number, item)
    return Row(str(path), number, None, f"is a {type(item).__name__}, not an object")


def _jsonl_rows(path: Path, text: str) -> list[Row]:
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            rows.append(Row(str(path), number, None, f"is not valid JSON: {exc.msg}"))
            continue
        rows.append(_object_row(path, number, item))
    return rows


def _json_rows(path: Path, text: str) -> list[Row]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data":  # one object per line under a .json name: read it as JSONL
            return _jsonl_rows(path, text)
        raise UserError(f"dataset {path} row {exc.lineno} is not valid JSON: {exc.msg}") from None
    if isinstance(data, dict):
        lists = {k: v for k, v in data.items() if isinstance(v, list)}
        if len(lists) == 1 and all(isinstance(i, dict) for i in next(iter(lists.values()))):
            data = next(iter(lists.values()))  # {"train": [{...}, ...]}
        elif lists and len(lists) == len(data) and len({len(v) for v in lists.values()}) == 1:
            columns = list(lists)  # {"instruction": [...], "output": [...]}
            data = [dict(zip(columns, values, strict=True)) for values in zip(*lists.values(), strict=True)]
        else:
            raise UserError(
                f"dataset {path} is a JSON object; expected a list of rows, an object holding one list of rows, "
                "or an object of equally long columns"
            )
    if not isinstance(data, list):
        raise UserError(f"dataset {path} must be a JSON list of rows")
    return [_object_row(path, number, item) for number, item in enumerate(data, start=1)]


def _csv_rows(path: Path, text: str) -> list[Row]:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    rows = []
    try:
        start = 2  # the header is line 1
        for item in reader:
            if None in item or None in item.values():
                rows.append(Row(str(path), start, None, f"has a different number of fields than the header "
                                                        f"({len(reader.fieldnames or [])})"))
            else:
                rows.append(Row(str(path), start, dict(item)))
            start = reader.line_num + 1
    except csv.Error as exc:
        raise UserError(f"dataset {path} row {reader.line_num} is not valid CSV: {exc}") from None
    return rows


def _parquet_file(path: Path) -> tuple[Any, Any]:
    """(the pyarrow ParquetFile, reading strings as dictionaries, and the schema that decodes them), once the
    metadata shows no column chunk that decompresses like a bomb."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise UserError(f"dataset {path} is not a readable Parquet file: {exc}") from None
    meta = parquet.metadata
    for group in range(meta.num_row_groups):
        info = meta.row_group(group)
        for column in range(info.num_columns):
            chunk = info.column(column)
            raw, stored = chunk.total_uncompressed_size, max(chunk.total_compressed_size, 1)
            if raw > PARQUET_JUDGED_FROM and raw > PARQUET_MAX_EXPANSION * stored:
                raise UserError(
                    f"dataset {path}: row group {group}, column {chunk.path_in_schema!r} stores {stored:,} bytes that "
                    f"decompress to {raw:,} ({raw // stored:,} times as many): refused as a decompression bomb "
                    f"(Parquet data may expand at most {PARQUET_MAX_EXPANSION:,} times; {_AS_JSONL})")
    strings = [c.path for c in parquet.schema if c.physical_type == "BYTE_ARRAY" and c.logical_type.type != "DECIMAL"]
    try:
        return pq.ParquetFile(path, read_dictionary=strings), parquet.schema_arrow
    except (pa.ArrowException, OSError) as exc:
        raise UserError(f"dataset {path} is not a readable Parquet file: {exc}") from None


def _decoded_bytes(array: Any) -> int:
    """The bytes an Arrow array (or record batch) takes once its dictionaries are decoded, counted without
    decoding them (Python's rows take at least as much)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(array, pa.RecordBatch):
        return sum(_decoded_bytes(column) for column in array.columns)
    if isinstance(array, pa.DictionaryArray):
        return int(pc.sum(pc.take(pc.binary_length(array.dictionary), array.indices)).as_py() or 0)
    if isinstance(array, (pa.ListArray, pa.LargeListArray, pa.FixedSizeListArray)):
        return 8 * len(array) + _decoded_bytes(array.flatten())
    if isinstance(array, pa.StructArray):
        return sum(_decoded_bytes(field) for field in array.flatten())
    return array.nbytes


def _parquet_rows(path: Path) -> list[Row]:
    import pyarrow as pa

    parquet, schema = _parquet_file(path)
    size = path.stat().st_size
    bound = max(PARQUET_MAX_EXPANSION * size, PARQUET_FREE_BYTES)
    rows: list[Row] = []
    decoded = 0
    try:
        for group in range(parquet.metadata.num_row_groups):
            for batch in parquet.iter_batches(row_groups=[group]):
                decoded += _decoded_bytes(batch)
                if decoded > bound:
                    raise UserError(
                        f"dataset {path}: its rows decode to more than {bound:,} bytes by row group {group}, over "
                        f"{PARQUET_MAX_EXPANSION:,} times the file's {size:,} bytes (and over {PARQUET_FREE_BYTES:,}): "
                        f"refused as a decompression bomb ({_AS_JSONL})")
                items = batch.cast(schema).to_pylist()
                rows.extend(Row(str(path), len(rows) + n, item) for n, item in enumerate(items, start=1))
    except (pa.ArrowException, OSError) as exc:
        raise UserError(f"dataset {path} is not a readable Parquet file: {exc}") from None
    return rows


def _parquet_head(path: Path, max_rows: int, max_bytes: int) -> tuple[list[Row], int]:
    """The first rows of a Parquet file, decoding at most max_bytes of them: whole rows, as many as fit."""
    import pyarrow as pa

    parquet, schema = _parquet_file(path)
    meta = parquet.metadata
    items: list[dict[str, Any]] = []
    left, over = max_bytes, 0
    try:
        for group in range(meta.num_row_groups):
            info = meta.row_group(group)
            if len(items) >= max_rows or over:
                break
            if not info.num_rows:
                continue
            # Rows' stored pages, on average: no more of them are decoded than could fit (strings stay dictionaries).
            per_row = sum(info.column(c).total_uncompressed_size for c in range(info.num_columns)) // info.num_rows
            if per_row > left:
                over = per_row
                break
            take = min(max_rows - len(items), info.num_rows, left // per_row if per_row else max_rows)
            batch = next(parquet.iter_batches(batch_size=take, row_groups=[group]))
            for n in range(batch.num_rows):
                row = batch.slice(n, 1)
                if (size := _decoded_bytes(row)) > left:
                    over = size
                    break
                left -= size
                items.extend(row.cast(schema).to_pylist())
    except (pa.ArrowException, OSError) as exc:
        raise UserError(f"dataset {path} is not a readable Parquet file: {exc}") from None
    if not items and over:
        return [Row(str(path), 1, None, f"is longer than the {max_bytes:,} bytes the preview reads of a file (a row "
                                        f"of it decodes to {over:,} bytes)")], meta.num_rows
    return [Row(str(path), n, item) for n, item in enumerate(items, start=1)], meta.num_rows


def read_file(path: Path) -> list[Row]:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return _parquet_rows(path)
    text = _read_text(path)
    if suffix == ".jsonl":
        return _jsonl_rows(path, text)
    if suffix == ".csv":
        return _csv_rows(path, text)
    return _json_rows(path, text)


def _local_files(paths: list[str], train_split: str, eval_split: str | None) -> tuple[list[Path], list[Path]]:
    """Training files and eval files. Inside folders, files named after a split belong to it."""
    train: list[Path] = []
    evals: list[Path] = []
    # eval_split is a path when it reads like one ("data/val.jsonl"), else a split name ("test").
    explicit_eval = expand(eval_split) if eval_split and ("/" in eval_split or Path(eval_split).suffix
                                                                     in SUPPORTED_SUFFIXES) else None
    if explicit_eval is not None:
        if not explicit_eval.exists():
            raise UserError(f"eval_split {eval_split!r}: no such file or folder")
        evals = _files(explicit_eval)
    for raw in paths:
        path = Path(raw)
        found = [f for f in _files(path) if f not in evals]
        if eval_split and explicit_eval is None:
            evals.extend(f for f in found if _split_of(f, eval_split))
            found = [f for f in found if not _split_of(f, eval_split)]
        if path.is_dir() and any(_split_of(f, train_split) for f in found):
            found = [f for f in found if _split_of(f, train_split)]
        train.extend(found)
    if eval_split and not evals:
        raise UserError(
            f"eval_split {eval_split!r}: no file named {eval_split}.* or {eval_split}-*.* among the local datasets, "
            "and no such path; name an eval file by path, or leave eval_split unset to hold out rows automatically"
        )
    if not train:
        raise UserError(f"dataset {', '.join(paths)}: every file belongs to eval_split {eval_split!r}")
    return train, evals


def _each_file_once(files: list[Path]) -> None:
    """Refuse a file that local_datasets reach twice (a folder and a file in it, two names of one file): its rows
    would be trained on twice. JobConfig refuses a path written twice; this is what only the filesystem knows."""
    seen: dict[Path, Path] = {}
    for path in files:
        real = path.resolve()
        if real in seen:
            names = f" (as {seen[real]} and as {path})" if seen[real] != path else ""
            raise UserError(f"dataset {real} is reached twice through local_datasets{names}, a folder and a file "
                            "in it or two names of one file; list each file once (its rows would be read twice)")
        seen[real] = path


def read_local(cfg: JobConfig | ReportSpec) -> Rows:
    train_files, eval_files = _local_files(cfg.local_datasets, cfg.train_split, cfg.eval_split)
    _each_file_once(train_files)
    train = [row for f in train_files for row in read_file(f)]
    evals = [row for f in eval_files for row in read_file(f)] if eval_files else None
    if not train:
        raise UserError(f"dataset {', '.join(str(f) for f in train_files)} is empty: no rows to train on")
    names = ", ".join(f.name for f in train_files[:5]) + (f" and {len(train_files) - 5} more" if len(train_files) > 5
                                                           else "")
    return Rows(train, evals, f"{len(train_files)} file(s): {names}")


# --- the first rows only (the dataset preview) --------------------------------------
def _head_bytes(path: Path, max_bytes: int) -> str:
    """At most max_bytes of a text file, decoded, cut after its last complete line."""
    with path.open("rb") as fh:
        raw = fh.read(max_bytes)
    raw = raw[: raw.rfind(b"\n") + 1]  # a cut line is not a row
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise UserError(
            f"dataset {path} row {line} is not valid UTF-8 (byte offset {exc.start}); save the file as UTF-8"
        ) from None


def _json_list_head(path: Path, text: str) -> list[Row]:
    """The complete objects at the start of a JSON list whose end was not read."""
    decoder = json.JSONDecoder()
    at = len(text) - len(text.lstrip("\ufeff \t\r\n"))
    if not text.startswith("[", at):
        raise UserError(f"dataset {path} is a large JSON file that is not a list of rows: the preview reads only "
                        "the start of a file; convert it to JSONL to preview it")
    rows: list[Row] = []
    at += 1
    while True:
        while at < len(text) and text[at] in " \t\r\n,":
            at += 1
        try:
            item, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            return rows  # the first incomplete row: where reading stopped
        rows.append(_object_row(path, len(rows) + 1, item))


def read_file_head(path: Path, max_rows: int, max_bytes: int) -> tuple[list[Row], int | None]:
    """The first rows of one file, reading at most about max_bytes of it (of Parquet: decoding).

    Returns (rows, the file's row count when known: it was read whole, or Parquet says).
    """
    size = path.stat().st_size
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return _parquet_head(path, max_rows, max_bytes)
    if size <= max_bytes:
        rows = read_file(path)
        return rows, len(rows)
    text = _head_bytes(path, max_bytes)
    if not text.strip():
        return [Row(str(path), 1, None, f"is longer than the {max_bytes:,} bytes the preview reads of a file")], None
    if suffix == ".jsonl":
        return _jsonl_rows(path, text), None
    if suffix == ".csv":
        return _csv_rows(path, text), None
    try:
        return _json_rows(path, text), None  # JSON Lines under a .json name
    except UserError:
        return _json_list_head(path, text), None


def read_head(paths: list[str], train_split: str, max_rows: int, max_bytes: int) -> tuple[list[Row], str, int | None]:
    """The first training rows of local files, each file read once and only its first max_bytes.

    Files are read until max_rows rows are in. Returns (rows, description, the total row count when known).
    """
    train_files, _ = _local_files(paths, train_split, None)
    unique = list(dict.fromkeys(f.resolve() for f in train_files))
    rows: list[Row] = []
    total: int | None = 0
    for number, path in enumerate(unique):
        got, count = read_file_head(path, max_rows, max_bytes)
        rows.extend(got)
        total = None if total is None or count is None else total + count
        if len(rows) >= max_rows and number < len(unique) - 1:
            total = None  # files left unread
            break
    names = ", ".join(f.name for f in unique[:5]) + (f" and {len(unique) - 5} more" if len(unique) > 5 else "")
    return rows, f"{len(unique)} file(s): {names}", total


# --- datasets / hub ---------------------------------------------------------------
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


def _dataset_rows(source: str, dataset: Any) -> Iterator[Row]:
    for number, item in enumerate(dataset, start=1):
        yield Row(source, number, dict(item))


def read_hub(cfg: JobConfig | ReportSpec) -> Rows:
    name = cfg.hf_dataset or ""
    path = expand(name)
    load = (lambda split: _from_disk(cfg, path, split)) if path.is_dir() and _saved_by_datasets(path) else (
        lambda split: _load(cfg, split))
    train = list(_dataset_rows(f"{name}[{cfg.train_split}]", load(cfg.train_split)))
    evals = list(_dataset_rows(f"{name}[{cfg.eval_split}]", load(cfg.eval_split))) if cfg.eval_split else None
    if not train:
        raise UserError(f"dataset {name!r} split {cfg.train_split!r} is empty: no rows to train on")
    subset = f", subset {cfg.subset}" if cfg.subset else ""
    return Rows(train, evals, f"{name} (split {cfg.train_split}{subset})")


def read_rows(cfg: JobConfig | ReportSpec) -> Rows:
    return read_hub(cfg) if cfg.hf_dataset else read_local(cfg)
