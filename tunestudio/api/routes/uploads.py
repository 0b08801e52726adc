"""/api/uploads: dataset files sent from the browser (multipart/form-data), kept for reuse.

Files live in the data directory's `data/uploads/` (a dataset root of their own, see
Settings.allowed_dataset_roots): a job then names one in `local_datasets` like any local file.
The size limit is `max_upload_bytes` (the body limit of every other route stays `max_body_bytes`);
the folder as a whole holds at most `max_uploads_total_bytes`. A disk that fills during an upload
is a 507, and the partial file is removed.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, File, Request, Response, UploadFile
from pydantic import BaseModel

from tunestudio.api.deps import ManagerDep, SettingsDep
from tunestudio.api.errors import ApiError
from tunestudio.api.schemas import ERRORS, ErrorOut
from tunestudio.jobs.status import JobStatus

router = APIRouter(prefix="/api/uploads", tags=["uploads"], responses=ERRORS)

KINDS = (".jsonl", ".json", ".csv", ".parquet")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_TEMPORARY = ".upload-"
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
# Bytes of uploads being written now, per folder: counted against the total before they are on disk.
_reserved: dict[Path, int] = {}
_reserved_lock = threading.Lock()


class Upload(BaseModel):
    name: str
    path: str
    bytes: int
    modified: float


class UploadList(BaseModel):
    items: list[Upload]
    directory: str
    max_bytes: int
    total_bytes: int
    max_total_bytes: int


def _described(path: Path) -> Upload:
    stat = path.stat()
    return Upload(name=path.name, path=str(path), bytes=stat.st_size, modified=stat.st_mtime)


def _safe_name(raw: str) -> str:
    """The file's own name, reduced to safe characters; its extension must be a dataset format."""
    name = _UNSAFE.sub("_", Path(raw or "").name).strip("._")
    suffix = Path(name).suffix.lower()
    if suffix not in KINDS:
        raise ApiError(422, "invalid_request", f"file {raw!r}: a dataset upload must be one of "
                       f"{', '.join(KINDS)}", field="file")
    stem = Path(name).stem[:100] or "dataset"
    return f"{stem}{suffix}"


def _free_name(folder: Path, name: str) -> Path:
    """name, or name-2, name-3... : an upload never replaces another (a job may be reading it)."""
    path, n = folder / name, 1
    while path.exists():
        n += 1
        path = folder / f"{Path(name).stem}-{n}{Path(name).suffix}"
    return path


def _stored_bytes(folder: Path) -> int:
    """What the uploads folder holds (files being written count through `_reserved` instead)."""
    total = 0
    for path in folder.iterdir():
        try:
            if path.is_file() and not path.name.startswith(_TEMPORARY):
                total += path.stat().st_size
        except OSError:
            continue
    return total


@router.get("", response_model=UploadList)
def list_uploads(settings: SettingsDep) -> UploadList:
    """Uploaded datasets, newest first."""
    folder = settings.uploads_dir()
    files = [p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in KINDS]
    items = sorted((_described(p) for p in files), key=lambda u: u.modified, reverse=True)
    return UploadList(items=items, directory=str(folder), max_bytes=settings.max_upload_bytes,
                      total_bytes=_stored_bytes(folder), max_total_bytes=settings.max_uploads_total_bytes)


async def _one_file(request: Request) -> None:
    """A second part named `file` would be dropped without a word: refuse the request instead."""
    count = len((await request.form()).getlist("file"))  # the form FastAPI has already read (cached)
    if count > 1:
        raise ApiError(422, "invalid_request", f"send one file per upload; this request has {count} parts named "
                       "`file`", field="file")


def _reserve(folder: Path, size: int, quota: int) -> None:
    """Count `size` bytes against the folder's total, or refuse (413) when they would take it past the quota."""
    with _reserved_lock:
        used = _stored_bytes(folder) + _reserved.get(folder, 0)
        if used + size > quota:
            raise ApiError(413, "too_large", f"the uploads folder holds {used} bytes and this file ({size} bytes) "
                           f"would take it past its total of {quota} bytes (TUNESTUDIO_MAX_UPLOADS_TOTAL_BYTES); "
                           "delete uploads you no longer need, or raise the limit", field="file")
        _reserved[folder] = _reserved.get(folder, 0) + size


def _release(folder: Path, size: int) -> None:
    with _reserved_lock:
        left = _reserved.get(folder, 0) - size
        if left > 0:
            _reserved[folder] = left
        else:
            _reserved.pop(folder, None)


@router.post("", status_code=201, response_model=Upload, dependencies=[Depends(_one_file)],
             responses={507: {"model": ErrorOut, "description": "The disk holding the uploads folder is full"}},
             openapi_extra={"description": "multipart/form-data with one part named `file`."})
def upload_dataset(settings: SettingsDep, file: Annotated[UploadFile, File(description="A dataset file.")]) -> Upload:
    """Store one dataset file (JSON, JSONL, CSV or Parquet) under data/uploads; its path goes in local_datasets."""
    name = _safe_name(file.filename or "")
    folder = settings.uploads_dir()
    file.file.seek(0, os.SEEK_END)  # the request's copy of the file, already received in full
    size = file.file.tell()
    file.file.seek(0)
    _reserve(folder, size, settings.max_uploads_total_bytes)
    try:
        return _described(_store(file, folder, name))
    finally:
        _release(folder, size)


def _store(file: UploadFile, folder: Path, name: str) -> Path:
    """Write the upload to a temporary file beside its final place, then rename it: nobody sees half a file,
    and a failure (a full disk: 507) leaves nothing behind."""
    tmp: str | None = None
    try:
        handle, tmp = tempfile.mkstemp(dir=folder, prefix=_TEMPORARY)
        with os.fdopen(handle, "wb") as out:
            shutil.copyfileobj(file.file, out, 1 << 20)
        if os.path.getsize(tmp) == 0:
            raise ApiError(422, "invalid_request", f"file {file.filename!r} is empty", field="file")
        path = _free_name(folder, name)
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno in _NO_SPACE:
            raise ApiError(507, "insufficient_storage", f"the disk holding the uploads folder is full "
                           f"({os.strerror(exc.errno)}), so {file.filename!r} was not kept; free some space "
                           "(or delete uploads) and send it again", field="file") from None
        raise
    return path


@router.delete("/{name}", status_code=204)
def delete_upload(name: str, settings: SettingsDep, manager: ManagerDep) -> Response:
    """Delete an uploaded dataset; refused (409) while a queued or running job reads it."""
    folder = settings.uploads_dir()
    path = folder / name
    if Path(name).name != name or not path.is_file():
        raise ApiError(404, "not_found", f"no uploaded dataset {name!r}")
    live = [s for s in JobStatus if s.is_live]
    for job in manager.list(live, limit=10_000):
        if any(Path(p).resolve() == path.resolve() for p in job.config.get("local_datasets") or []):
            raise ApiError(409, "conflict", f"job {job.id} ({job.status.value}) reads {name}; wait for it to end")
    path.unlink()
    return Response(status_code=204)
