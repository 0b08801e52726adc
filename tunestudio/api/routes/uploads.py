"""/api/uploads: dataset files sent from the browser (multipart/form-data), kept for reuse.

Files live in the data directory's `data/uploads/` (a dataset root of their own, see
Settings.allowed_dataset_roots): a job then names one in `local_datasets` like any local file.
The size limit is `max_upload_bytes` (the body limit of every other route stays `max_body_bytes`).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, File, Response, UploadFile
from pydantic import BaseModel

from tunestudio.api.deps import ManagerDep, SettingsDep
from tunestudio.api.errors import ApiError
from tunestudio.api.schemas import ERRORS
from tunestudio.jobs.status import JobStatus

router = APIRouter(prefix="/api/uploads", tags=["uploads"], responses=ERRORS)

KINDS = (".jsonl", ".json", ".csv", ".parquet")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class Upload(BaseModel):
    name: str
    path: str
    bytes: int
    modified: float


class UploadList(BaseModel):
    items: list[Upload]
    directory: str
    max_bytes: int


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


@router.get("", response_model=UploadList)
def list_uploads(settings: SettingsDep) -> UploadList:
    """Uploaded datasets, newest first."""
    folder = settings.uploads_dir()
    files = [p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in KINDS]
    items = sorted((_described(p) for p in files), key=lambda u: u.modified, reverse=True)
    return UploadList(items=items, directory=str(folder), max_bytes=settings.max_upload_bytes)


@router.post("", status_code=201, response_model=Upload,
             openapi_extra={"description": "multipart/form-data with one part named `file`."})
def upload_dataset(settings: SettingsDep, file: Annotated[UploadFile, File(description="A dataset file.")]) -> Upload:
    """Store one dataset file (JSON, JSONL, CSV or Parquet) under data/uploads; its path goes in local_datasets."""
    name = _safe_name(file.filename or "")
    folder = settings.uploads_dir()
    # Written to a temporary file beside its final place, then renamed: nobody sees half a file.
    handle, tmp = tempfile.mkstemp(dir=folder, prefix=".upload-")
    try:
        with os.fdopen(handle, "wb") as out:
            shutil.copyfileobj(file.file, out, 1 << 20)
        if os.path.getsize(tmp) == 0:
            raise ApiError(422, "invalid_request", f"file {file.filename!r} is empty", field="file")
        path = _free_name(folder, name)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return _described(path)


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
