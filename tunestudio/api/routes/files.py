"""/v1/files: OpenAI's Files API for fine-tuning, over the uploads folder (api/upload_store.py).

A file is an upload (`file-<name>`, api/fine_tuning.py): the page's uploads are listed too. An upload here
must be OpenAI's fine-tuning JSONL (api/fine_tune_data.py); a bad line is a 400 naming it, and nothing is
kept. The size limits and the folder's total are the page's (`max_upload_bytes`,
`max_uploads_total_bytes`). A job's metrics are the file `file-results-<job id>`, made when asked for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, File, Form, Query, Response, UploadFile
from fastapi.responses import FileResponse
from pydantic import BaseModel

from tunestudio.api import fine_tune_data, upload_store
from tunestudio.api.deps import ManagerDep, SettingsDep
from tunestudio.api.errors import ApiError
from tunestudio.api.fine_tuning import (
    JOB_PREFIX,
    RESULTS_PREFIX,
    FineTuningRoute,
    chain_of,
    not_found,
    upload_id,
    upload_path,
)
from tunestudio.api.fine_tuning_history import results_csv
from tunestudio.api.routes.uploads import one_file
from tunestudio.api.schemas import OPENAI_ERRORS
from tunestudio.api.upload_store import CONVERTED
from tunestudio.jobs import JobNotFound

router = APIRouter(prefix="/v1/files", tags=["OpenAI-compatible fine-tuning"], route_class=FineTuningRoute,
                   responses=OPENAI_ERRORS)

Purpose = Literal["fine-tune", "fine-tune-results"]


class FileObject(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: Purpose = "fine-tune"
    status: Literal["processed"] = "processed"
    expires_at: int | None = None
    status_details: str | None = None


class FileList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FileObject]
    has_more: bool
    first_id: str | None = None
    last_id: str | None = None


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


def _described(path: Path) -> FileObject:
    stat = path.stat()
    return FileObject(id=upload_id(path), bytes=stat.st_size, created_at=int(stat.st_mtime), filename=path.name)


@router.post("", response_model=FileObject, dependencies=[Depends(one_file)],
             openapi_extra={"description": "multipart/form-data: `file` (JSONL) and `purpose` (fine-tune)."})
def create_file(settings: SettingsDep, file: Annotated[UploadFile, File()],
                purpose: Annotated[str, Form()]) -> FileObject:
    """Upload a fine-tuning file: chat rows (`messages`) or preference rows (`input`, `preferred_output`,
    `non_preferred_output`), one JSON object a line."""
    if purpose != "fine-tune":
        raise ApiError(400, "invalid_request", f"purpose {purpose!r}: this server keeps fine-tuning files only "
                       "(purpose 'fine-tune')", field="purpose")
    name = upload_store.safe_name(file.filename or "", kinds=(".jsonl",))
    try:
        fine_tune_data.check(file.file)
    except fine_tune_data.BadFile as exc:
        raise ApiError(400, "invalid_file_format", f"file {file.filename!r}: {exc}", field="file") from None
    folder = settings.uploads_dir()
    size = upload_store.size_of(file.file)
    with upload_store.reserved(folder, size, settings.max_uploads_total_bytes):
        path = upload_store.write_file(folder, name, file.filename or name, upload_store.copy_from(file.file))
    return _described(path)


@router.get("", response_model=FileList)
def list_files(
    settings: SettingsDep,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    order: Literal["asc", "desc"] = "desc",
    purpose: str | None = None,
) -> FileList:
    """The uploads, newest first (`order=asc`: oldest first). Results files are not listed; a job names its own."""
    folder = settings.uploads_dir()
    paths = [] if purpose not in (None, "fine-tune") else [
        p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in upload_store.KINDS]
    paths.sort(key=lambda p: (p.stat().st_mtime_ns, p.name), reverse=order == "desc")
    files = [_described(p) for p in paths]
    if after is not None:
        ids = [f.id for f in files]
        if after not in ids:
            raise not_found("file", after, "after")
        files = files[ids.index(after) + 1:]
    page = files[:limit]
    return FileList(data=page, has_more=len(files) > limit, first_id=page[0].id if page else None,
                    last_id=page[-1].id if page else None)


def _results(manager: ManagerDep, file_id: str) -> tuple[FileObject, str]:
    try:
        chain = chain_of(manager, JOB_PREFIX + file_id.removeprefix(RESULTS_PREFIX))
    except JobNotFound:
        raise not_found("file", file_id, "file_id") from None
    text = results_csv(manager, chain)
    described = FileObject(id=file_id, bytes=len(text.encode()), created_at=int(chain.last.finished_at
                           or chain.last.created_at), filename=f"{chain.id}-results.csv", purpose="fine-tune-results")
    return described, text


@router.get("/{file_id}", response_model=FileObject)
def retrieve_file(file_id: str, settings: SettingsDep, manager: ManagerDep) -> FileObject:
    if file_id.startswith(RESULTS_PREFIX):
        return _results(manager, file_id)[0]
    return _described(upload_path(settings, file_id))


@router.get("/{file_id}/content", response_class=Response,
            responses={200: {"content": {"application/octet-stream": {}, "text/csv": {}}}})
def file_content(file_id: str, settings: SettingsDep, manager: ManagerDep) -> Response:
    """The file's bytes (a results file: its CSV)."""
    if file_id.startswith(RESULTS_PREFIX):
        described, text = _results(manager, file_id)
        return Response(text, media_type="text/csv",
                        headers={"Content-Disposition": f'attachment; filename="{described.filename}"'})
    path = upload_path(settings, file_id)
    return FileResponse(path, media_type="application/octet-stream", filename=path.name)


@router.delete("/{file_id}", response_model=FileDeleted)
def delete_file(file_id: str, settings: SettingsDep, manager: ManagerDep) -> FileDeleted:
    """Delete an upload and the copies jobs trained on; refused (409) while a queued or running job reads one."""
    if file_id.startswith(RESULTS_PREFIX):
        raise ApiError(400, "invalid_request", f"{file_id} is a job's metrics, made when asked for; delete the job "
                       "to delete them", field="file_id")
    path = upload_path(settings, file_id)
    copies = [p for p in (settings.uploads_dir() / CONVERTED).glob(f"*/{path.name}") if p.is_file()]
    if (job := upload_store.readers(manager, [path, *copies])) is not None:
        raise ApiError(409, "conflict", f"fine-tuning job {JOB_PREFIX}{job.id} ({job.status.value}) reads "
                       f"{file_id}; wait for it to end, or cancel it", field="file_id")
    for copy in copies:
        copy.unlink(missing_ok=True)
    path.unlink(missing_ok=True)
    return FileDeleted(id=file_id)
