"""/api/jobs/{id}/log: the worker's log file of any job, live while it runs, by byte range or tail.

The file is the job's own (`worker.log` in its job folder, written by the worker): it outlives
the server, so a job opened after a restart still shows its log. Offsets are bytes; a part is cut
at whole UTF-8 characters, so a client that asks from `X-Log-End` next never sees half a character.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Header, Query, Response
from fastapi.responses import JSONResponse

from tunestudio.api.deps import ManagerDep
from tunestudio.api.errors import ApiError, error_body
from tunestudio.api.routes.downloads import regular_file_in
from tunestudio.api.schemas import ERRORS, ErrorOut
from tunestudio.jobs import INT64_MAX, JobManager

router = APIRouter(prefix="/api/jobs", tags=["jobs"], responses=ERRORS)

MAX_PART = 1_048_576  # one answer holds at most this many bytes (a download has no limit)
_RANGE = re.compile(r"^bytes=([0-9]*)-([0-9]*)$")  # one range; ASCII digits only (\d also takes other scripts')
_BEYOND = 10**18  # a position with more digits than this is past the end of any log (and int() stays cheap)


def _position(digits: str) -> int:
    return int(digits) if len(digits) <= 18 else _BEYOND


def _unsatisfiable(spec: str, size: int, why: str) -> JSONResponse:
    """416, with the log's size in `Content-Range: bytes */SIZE` (RFC 9110 15.5.17)."""
    return JSONResponse(error_body("bad_range", f"cannot serve the range {spec[:100]!r}: {why}"), status_code=416,
                        headers={"Content-Range": f"bytes */{size}", "Cache-Control": "no-store"})


def _whole_chars(data: bytes, at_start: bool) -> tuple[int, int]:
    """(skip, drop): bytes to skip at the start (continuation bytes) and drop at the end (an unfinished char)."""
    skip = 0
    if at_start:
        while skip < min(3, len(data)) and data[skip] & 0xC0 == 0x80:
            skip += 1
    drop = 0
    for back in range(1, min(4, len(data) - skip) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:
            continue
        if byte >= 0xC0:  # a lead byte: is its character complete?
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            drop = back if back < need else 0
        break
    return skip, drop


@router.get("/{job_id}/log", response_class=Response,
            responses={200: {"content": {"text/plain": {}}}, 206: {"content": {"text/plain": {}}},
                       416: {"model": ErrorOut, "description": "A Range the log cannot serve (Content-Range: "
                                                               "bytes */SIZE)"}})
def job_log(
    job_id: str,
    manager: ManagerDep,
    tail: Annotated[int | None, Query(ge=1, le=MAX_PART, description="The last this many bytes.")] = None,
    offset: Annotated[int | None, Query(ge=0, le=INT64_MAX, description="From this byte on.")] = None,
    length: Annotated[int, Query(ge=1, le=MAX_PART)] = MAX_PART,
    download: bool = False,
    range_: Annotated[str | None, Header(alias="range")] = None,
) -> Response:
    """Part of the worker's log as text. X-Log-Start/X-Log-End say which bytes, X-Log-Size how many the file has.

    `tail`, `offset`/`length` or an HTTP `Range: bytes=a-b` choose the part (the default: the first MiB);
    `download=true` sends the whole file as an attachment.
    """
    path, exists, size = _log_file(manager, job_id)
    if download:
        body = path.read_bytes() if exists and path else b""
        return Response(body, media_type="text/plain; charset=utf-8", headers={
            "Content-Disposition": f'attachment; filename="{job_id}-worker.log"', "X-Log-Size": str(len(body))})
    status = 200
    if range_ is not None and tail is None and offset is None:
        chosen = _from_range(range_, size, length)
        if isinstance(chosen, JSONResponse):
            return chosen
        tail, offset, length = chosen
        # A suffix of an empty log is satisfiable, but no byte range names nothing: the whole (empty) log, 200.
        status = 206 if size > 0 else 200
    start = max(0, size - tail) if tail is not None else min(offset or 0, size)
    end = min(size, start + (tail if tail is not None else length))
    data = b""
    if exists and path and end > start:
        data, start, end = _read_part(path, start, end, at_start=tail is not None and start > 0)
    headers = {"X-Log-Start": str(start), "X-Log-End": str(end), "X-Log-Size": str(size),
               "X-Log-Exists": "true" if exists else "false", "Cache-Control": "no-store", "Accept-Ranges": "bytes"}
    if status == 206:
        headers["Content-Range"] = f"bytes {start}-{max(start, end - 1)}/{size}"
    return Response(data.decode("utf-8", errors="replace"), status_code=status,
                    media_type="text/plain; charset=utf-8", headers=headers)


def _log_file(manager: JobManager, job_id: str) -> tuple[Path | None, bool, int]:
    """The job's log file, whether it is there (a regular file of the job's folder), and its size."""
    job = manager.get(job_id)
    path = Path(job.log_path) if job.log_path else None
    exists = path is not None and regular_file_in(path, manager.settings.jobs_dir() / job.id)
    if path is not None and not exists and (path.is_symlink() or path.exists()):
        # A link (or anything but a file) in the log's place is not the job's log: refused as the file routes do.
        raise ApiError(404, "not_found", f"job {job_id} has no worker log it wrote: {path.name} is not a regular "
                                         "file of its folder")
    size = path.stat().st_size if exists and path else 0
    return path, exists, size


def _from_range(range_: str, size: int, length: int) -> JSONResponse | tuple[int | None, int | None, int]:
    """(tail, offset, length) an HTTP Range asks for, or the 416 that refuses it."""
    # RFC 9110 14.1: bytes=FIRST-LAST, bytes=FIRST- or bytes=-SUFFIX; a LAST past the end means the end.
    match = _RANGE.match(range_.strip())
    if match is None or match.groups() == ("", ""):
        return _unsatisfiable(range_, size, "send one range, bytes=START-END, bytes=START- or bytes=-COUNT")
    first, last = match.groups()
    if first == "":
        if _position(last) == 0:
            return _unsatisfiable(range_, size, "a suffix of 0 bytes is empty")
        return min(_position(last), MAX_PART), None, length
    offset = _position(first)
    if last != "" and _position(last) < offset:
        return _unsatisfiable(range_, size, "it ends before it starts")
    if offset >= size:
        return _unsatisfiable(range_, size, f"the log has {size} bytes")
    if last != "":
        length = min(_position(last) - offset + 1, MAX_PART)
    return None, offset, length


def _read_part(path: Path, start: int, end: int, at_start: bool) -> tuple[bytes, int, int]:
    """Bytes start..end of the log, cut at whole UTF-8 characters, and the start and end they have then."""
    with path.open("rb") as handle:
        handle.seek(start)
        data = handle.read(end - start)
    skip, drop = _whole_chars(data, at_start=at_start)
    data = data[skip:len(data) - drop]
    return data, start + skip, start + skip + len(data)


@router.get("/{job_id}/samples")
def job_samples(job_id: str, manager: ManagerDep) -> dict[str, list[dict[str, str]]]:
    """The before/after samples of a finished job (its `sample_prompts`, answered by the base model and the
    result), read from the job's `completed` event; empty while it runs or when it had none."""
    job = manager.get(job_id)
    if not job.status.is_terminal or not job.spec.trains or not job.train_config.sample_prompts:
        return {"samples": []}
    with manager.subscribe(job_id) as subscription:
        for event in subscription.replay:
            if event.kind == "completed":
                return {"samples": list(event.data.get("samples") or [])}
    return {"samples": []}
