"""Reading rows from where the user keeps them: local files and folders, or a
`datasets` dataset (a hub id, a cached hub dataset, or a folder written by
`save_to_disk`).

One reader for every use: `open_rows` gives each split as a `Stream`, rows read
as they are asked for (JSON Lines and CSV a line at a time, Parquet a batch at a
time, a JSON document whole), as often as it is iterated. A job keeps the rows
in a list (`read_rows`); the dataset report goes through them a chunk at a
time, so a million-row file is never held as a million row objects.

File-level problems (no such format, not UTF-8, an unreadable file, a Parquet
decompression bomb) raise a UserError when the reading reaches them. Row-level
problems (a malformed JSON line, a row that is not an object) become a `Row`
with a `problem`, so the caller can drop and count it.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

from tunestudio.config import JobConfig, ReportSpec
from tunestudio.paths import expand
from tunestudio.worker.data.rows import Opened, Row, Rows, Stream
from tunestudio.worker.errors import UserError

SUPPORTED_SUFFIXES = (".json", ".jsonl", ".csv", ".parquet")


# --- local files ----------------------------------------------------------------
def _split_of(path: Path, split: str, root: Path | None = None) -> bool:
    """Whether a file belongs to a named split by the `datasets` convention: its name (test.jsonl,
    test-00000.parquet), or, inside the dataset folder `root`, a folder of that name it lies in (test/metadata.csv:
    an image folder's splits, each with its own captions file)."""
    folders = path.relative_to(root).parts[:-1] if root is not None and path.is_relative_to(root) else ()
    return any(name == split or name.startswith((f"{split}-", f"{split}_"))
               for name in (path.name.split(".")[0], *folders))


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        found = sorted(p for p in path.rglob("*") if p.suffix.lower() in SUPPORTED_SUFFIXES and p.is_file())
        if not found:
            raise UserError(f"dataset folder {path} holds no {', '.join(SUPPORTED_SUFFIXES)} files")
        return found
    if path.suffix.lower() not in SUPPORTED_SUFFIXES:
        raise UserError(f"dataset {path}: unsupported file type {path.suffix!r}; use {', '.join(SUPPORTED_SUFFIXES)}")
    return [path]


def _not_utf8(path: Path, line: int, offset: int) -> UserError:
    return UserError(f"dataset {path} row {line} is not valid UTF-8 (byte offset {offset}); save the file as UTF-8")


def _read_text(path: Path) -> str:
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise _not_utf8(path, raw[: exc.start].count(b"\n") + 1, exc.start) from None


def _object_row(path: Path, number: int, item: Any) -> Row:
    if isinstance(item, dict):
        return Row(str(path), number, item)
    return Row(str(path), number, None, f"is a {type(item).__name__}, not an object")


def _jsonl_row(path: Path, number: int, line: str) -> Row | None:
    """Line `number` of a JSON Lines file as a row; None for a blank line. Lines end at \\n alone (JSON Lines'
    separator; a U+2028 inside a string is text), in a file read whole or streamed, so their numbers agree."""
    if not line.strip():
        return None
    try:
        item = json.loads(line)
    except json.JSONDecodeError as exc:
        return Row(str(path), number, None, f"is not valid JSON: {exc.msg}")
    return _object_row(path, number, item)


def _jsonl_rows(path: Path, text: str) -> list[Row]:
    return [row for number, line in enumerate(text.split("\n"), start=1) if (row := _jsonl_row(path, number, line))]


def _iter_jsonl(path: Path) -> Iterator[Row]:
    with path.open("rb") as fh:
        offset = 0
        for number, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise _not_utf8(path, number, offset + exc.start) from None
            offset += len(raw)
            if (row := _jsonl_row(path, number, line)) is not None:
                yield row


def _iter_json(path: Path) -> Iterator[Row]:
    yield from _json_rows(path, _read_text(path))  # a JSON document is parsed whole


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


def _csv_items(path: Path, reader: csv.DictReader) -> Iterator[Row]:
    try:
        start = 2  # the header is line 1
        for item in reader:
            if None in item or None in item.values():
                yield Row(str(path), start, None, f"has a different number of fields than the header "
                                                  f"({len(reader.fieldnames or [])})")
            else:
                yield Row(str(path), start, dict(item))
            start = reader.line_num + 1
    except csv.Error as exc:
        raise UserError(f"dataset {path} row {reader.line_num} is not valid CSV: {exc}") from None


def _csv_rows(path: Path, text: str) -> list[Row]:
    return list(_csv_items(path, csv.DictReader(io.StringIO(text, newline=""))))


def _iter_csv(path: Path) -> Iterator[Row]:
    try:
        with path.open(encoding="utf-8-sig", newline="") as fh:
            yield from _csv_items(path, csv.DictReader(fh))
    except UnicodeDecodeError:
        _read_text(path)  # raises the error that names the row and byte
        raise


def iter_file(path: Path) -> Iterator[Row]:
    """One file's rows, read as they are asked for."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        from tunestudio.worker.data.parquet import parquet_rows

        return parquet_rows(path)
    if suffix == ".jsonl":
        return _iter_jsonl(path)
    if suffix == ".csv":
        return _iter_csv(path)
    return _iter_json(path)


def read_file(path: Path) -> list[Row]:
    return list(iter_file(path))


def _local_files(paths: list[str], train_split: str, eval_split: str | None) -> tuple[list[Path], list[Path]]:
    """Training files and eval files. Inside folders, files named after a split, or in a folder named after it,
    belong to it."""
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
        root = path if path.is_dir() else None
        if eval_split and explicit_eval is None:
            evals.extend(f for f in found if _split_of(f, eval_split, root))
            found = [f for f in found if not _split_of(f, eval_split, root)]
        if path.is_dir() and any(_split_of(f, train_split, root) for f in found):
            found = [f for f in found if _split_of(f, train_split, root)]
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


def _open_local(cfg: JobConfig | ReportSpec) -> Opened:
    train_files, eval_files = _local_files(cfg.local_datasets, cfg.train_split, cfg.eval_split)
    _each_file_once(train_files)
    names = ", ".join(f.name for f in train_files[:5]) + (f" and {len(train_files) - 5} more" if len(train_files) > 5
                                                           else "")
    return Opened(Stream(tuple(partial(iter_file, f) for f in train_files)),
                  Stream(tuple(partial(iter_file, f) for f in eval_files)) if eval_files else None,
                  f"{len(train_files)} file(s): {names}",
                  f"dataset {', '.join(str(f) for f in train_files)} is empty: no rows to train on")


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
        from tunestudio.worker.data.parquet import parquet_head

        return parquet_head(path, max_rows, max_bytes)
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


def open_rows(cfg: JobConfig | ReportSpec) -> Opened:
    """The job's rows as streams: its local files, or its `datasets` dataset (loaded: memory-mapped Arrow)."""
    if cfg.hf_dataset:
        from tunestudio.worker.data.hub_rows import open_hub

        return open_hub(cfg)
    return _open_local(cfg)


def read_rows(cfg: JobConfig | ReportSpec) -> Rows:
    """The job's rows in lists, as training takes them (`open_rows`, read through)."""
    opened = open_rows(cfg)
    train = list(opened.train)
    if not train:
        raise UserError(opened.empty)
    return Rows(train, list(opened.eval) if opened.eval is not None else None, opened.description)
