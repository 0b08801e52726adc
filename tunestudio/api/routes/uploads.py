"""/api/uploads: dataset files sent from the browser (multipart/form-data), kept for reuse.

Files live in the data directory's `data/uploads/` (a dataset root of their own, see
Settings.allowed_dataset_roots): a job then names one in `local_datasets` like any local file.
The size limit is `max_upload_bytes` (the body limit of every other route stays `max_body_bytes`);
the folder as a whole holds at most `max_uploads_total_bytes`. A disk that fills during an upload
is a 507, and the partial file is removed. Naming, the quota and the writing are api/upload_store.py's,
shared with OpenAI's /v1/files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, File, Request, Response, UploadFile
from pydantic import BaseModel

from tunestudio.api import upload_store
from tunestudio.api.deps import ManagerDep, SettingsDep
from tunestudio.api.errors import ApiError
from tunestudio.api.schemas import ERRORS, ErrorOut

router = APIRouter(prefix="/api/uploads", tags=["uploads"], responses=ERRORS)

KINDS = upload_store.KINDS


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


@router.get("", response_model=UploadList)
def list_uploads(settings: SettingsDep) -> UploadList:
    """Uploaded datasets, newest first."""
    folder = settings.uploads_dir()
    files = [p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in KINDS]
    items = sorted((_described(p) for p in files), key=lambda u: u.modified, reverse=True)
    return UploadList(items=items, directory=str(folder), max_bytes=settings.max_upload_bytes,
                      total_bytes=upload_store.stored_bytes(folder), max_total_bytes=settings.max_uploads_total_bytes)


async def one_file(request: Request) -> None:
    """A second part named `file` would be dropped without a word: refuse the request instead."""
    count = len((await request.form()).getlist("file"))  # the form FastAPI has already read (cached)
    if count > 1:
        raise ApiError(422, "invalid_request", f"send one file per upload; this request has {count} parts named "
                       "`file`", field="file")


@router.post("", status_code=201, response_model=Upload, dependencies=[Depends(one_file)],
             responses={507: {"model": ErrorOut, "description": "The disk holding the uploads folder is full"}},
             openapi_extra={"description": "multipart/form-data with one part named `file`."})
def upload_dataset(settings: SettingsDep, file: Annotated[UploadFile, File(description="A dataset file.")]) -> Upload:
    """Store one dataset file (JSON, JSONL, CSV or Parquet) under data/uploads; its path goes in local_datasets."""
    name = upload_store.safe_name(file.filename or "")
    folder = settings.uploads_dir()
    size = upload_store.size_of(file.file)  # the request's copy of the file, already received in full
    with upload_store.reserved(folder, size, settings.max_uploads_total_bytes):
        return _described(upload_store.write_file(folder, name, file.filename or name,
                                                  upload_store.copy_from(file.file)))


@router.delete("/{name}", status_code=204)
def delete_upload(name: str, settings: SettingsDep, manager: ManagerDep) -> Response:
    """Delete an uploaded dataset; refused (409) while a queued or running job reads it."""
    path = upload_store.stored(settings.uploads_dir(), name)
    if path is None:
        raise ApiError(404, "not_found", f"no uploaded dataset {name!r}")
    if (job := upload_store.readers(manager, [path])) is not None:
        raise ApiError(409, "conflict", f"job {job.id} ({job.status.value}) reads {name}; wait for it to end")
    path.unlink()
    return Response(status_code=204)
