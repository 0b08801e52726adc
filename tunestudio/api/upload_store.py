"""The uploads folder (the data directory's `data/uploads/`): names, the quota, writing a file whole or not at all.

Two faces store files here: the page's `/api/uploads` (routes/uploads.py) and OpenAI's `/v1/files`
(routes/files.py). Both name a file after the one sent (safe characters only, never replacing another:
`name-2.jsonl`), count it against `max_uploads_total_bytes` before it is on disk, and write it beside its
final place before renaming it in. Copies derived from an upload (OpenAI's rows in the studio's formats,
api/fine_tune_data.py) live in `converted/` below and count against the same total.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
import threading
import unicodedata
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from tunestudio.api.errors import ApiError
from tunestudio.jobs import Job, JobManager, JobStatus

__all__ = ["CONVERTED", "KINDS", "TEMPORARY", "copy_from", "free_name", "readers", "reserved", "safe_name", "size_of",
           "stored", "stored_bytes", "write_file"]

KINDS = (".jsonl", ".json", ".csv", ".parquet")
CONVERTED = "converted"  # copies derived from uploads, one folder per target format
TEMPORARY = ".upload-"
# Letters and digits of any script are kept (données 東京.jsonl → données_東京.jsonl); anything else is a "_".
_UNSAFE = re.compile(r"[^\w.-]+")
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
# Bytes of files being written now, per folder: counted against the total before they are on disk.
_reserved: dict[Path, int] = {}
_reserved_lock = threading.Lock()


def safe_name(raw: str, kinds: tuple[str, ...] = KINDS) -> str:
    """The file's own name, reduced to safe characters; its extension must be one of `kinds` (else a 422)."""
    name = _UNSAFE.sub("_", unicodedata.normalize("NFC", Path(raw or "").name)).strip("._")
    suffix = Path(name).suffix.lower()
    if suffix not in kinds:
        raise ApiError(422, "invalid_request", f"file {raw!r}: a dataset upload must be one of "
                       f"{', '.join(kinds)}", field="file")
    stem = Path(name).stem[:100]
    while len(stem.encode()) > 200:  # a file name is at most 255 bytes, and other scripts take 2-4 a letter
        stem = stem[:-1]
    stem = stem or "dataset"
    return f"{stem}{suffix}"


def stored(folder: Path, name: str) -> Path | None:
    """The upload named `name` in `folder`, or None: a name that is not a plain file name there (a path, a file
    that is not there, a name no filesystem takes: over 255 bytes, a NUL byte)."""
    path = folder / name
    try:
        return path if Path(name).name == name and path.is_file() else None
    except (OSError, ValueError):
        return None


def free_name(folder: Path, name: str) -> Path:
    """name, or name-2, name-3... : an upload never replaces another (a job may be reading it)."""
    path, n = folder / name, 1
    while path.exists():
        n += 1
        path = folder / f"{Path(name).stem}-{n}{Path(name).suffix}"
    return path


def stored_bytes(folder: Path) -> int:
    """What the uploads folder holds, converted copies included (files being written count through
    `reserved` instead)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            if name.startswith(TEMPORARY):
                continue
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


def size_of(handle: BinaryIO) -> int:
    """The size of a file the request has received in full; the handle is left at its start."""
    handle.seek(0, os.SEEK_END)
    size = handle.tell()
    handle.seek(0)
    return size


@contextmanager
def reserved(folder: Path, size: int, quota: int) -> Iterator[None]:
    """`size` bytes counted against the folder's total while the body runs; a 413 when they would take it past
    the quota."""
    with _reserved_lock:
        used = stored_bytes(folder) + _reserved.get(folder, 0)
        if used + size > quota:
            raise ApiError(413, "too_large", f"the uploads folder holds {used} bytes and this file ({size} bytes) "
                           f"would take it past its total of {quota} bytes (TUNESTUDIO_MAX_UPLOADS_TOTAL_BYTES); "
                           "delete uploads you no longer need, or raise the limit", field="file")
        _reserved[folder] = _reserved.get(folder, 0) + size
    try:
        yield
    finally:
        with _reserved_lock:
            left = _reserved.get(folder, 0) - size
            if left > 0:
                _reserved[folder] = left
            else:
                _reserved.pop(folder, None)


def write_file(folder: Path, name: str, what: str, write: Callable[[BinaryIO], None],
               place: Callable[[Path, str], Path] = free_name) -> Path:
    """Write a file through `write` into a temporary file in `folder`, then rename it to `place(folder, name)`:
    nobody sees half a file, and a failure (a full disk: 507) leaves nothing behind. `what` names the file in
    messages. An empty result is a 422."""
    tmp: str | None = None
    try:
        handle, tmp = tempfile.mkstemp(dir=folder, prefix=TEMPORARY)
        with os.fdopen(handle, "wb") as out:
            write(out)
        if os.path.getsize(tmp) == 0:
            raise ApiError(422, "invalid_request", f"file {what!r} is empty", field="file")
        path = place(folder, name)
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno in _NO_SPACE:
            raise ApiError(507, "insufficient_storage", f"the disk holding the uploads folder is full "
                           f"({os.strerror(exc.errno)}), so {what!r} was not kept; free some space "
                           "(or delete uploads) and send it again", field="file") from None
        raise
    return path


def copy_from(source: BinaryIO) -> Callable[[BinaryIO], None]:
    return lambda out: shutil.copyfileobj(source, out, 1 << 20)


def readers(manager: JobManager, paths: list[Path]) -> Job | None:
    """A queued or running job that reads one of `paths` (its datasets or its eval file), or None."""
    wanted = {p.resolve() for p in paths}
    live = [s for s in JobStatus if s.is_live]
    for job in manager.list(live, limit=10_000):
        if not job.spec.trains:  # an export or a benchmark reads no dataset of the uploads
            continue
        used = [*job.train_config.local_datasets, job.train_config.eval_split or ""]
        if any(p and Path(p).resolve() in wanted for p in used):
            return job
    return None
