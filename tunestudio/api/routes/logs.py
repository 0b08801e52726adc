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

from tunestudio.api.deps import ManagerDep
from tunestudio.api.errors import ApiError
from tunestudio.api.schemas import ERRORS
from tunestudio.jobs.store import INT64_MAX

router = APIRouter(prefix="/api/jobs", tags=["jobs"], responses=ERRORS)

MAX_PART = 1_048_576  # one answer holds at most this many bytes (a download has no limit)
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


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
            responses={200: {"content": {"text/plain": {}}}, 206: {"content": {"text/plain": {}}}})
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
    job = manager.get(job_id)
    path = Path(job.log_path) if job.log_path else None
    exists = path is not None and path.is_file()
    size = path.stat().st_size if exists and path else 0
    if download:
        body = path.read_bytes() if exists and path else b""
        return Response(body, media_type="text/plain; charset=utf-8", headers={
            "Content-Disposition": f'attachment; filename="{job_id}-worker.log"', "X-Log-Size": str(len(body))})
    status = 200
    if range_ is not None and tail is None and offset is None:
        match = _RANGE.match(range_.strip())
        if match is None or match.groups() == ("", ""):
            raise ApiError(416, "bad_range", f"cannot read the range {range_!r}; send bytes=START-END")
        first, last = match.groups()
        if first == "":
            tail = max(1, min(int(last), MAX_PART))
        else:
            offset = int(first)
            if last != "":
                if int(last) < offset:
                    raise ApiError(416, "bad_range", f"the range {range_!r} ends before it starts")
                length = min(int(last) - offset + 1, MAX_PART)
        status = 206
    start = max(0, size - tail) if tail is not None else min(offset or 0, size)
    end = min(size, start + (tail if tail is not None else length))
    data = b""
    if exists and path and end > start:
        with path.open("rb") as handle:
            handle.seek(start)
            data = handle.read(end - start)
        skip, drop = _whole_chars(data, at_start=tail is not None and start > 0)
        data = data[skip:len(data) - drop]
        start, end = start + skip, start + skip + len(data)
    headers = {"X-Log-Start": str(start), "X-Log-End": str(end), "X-Log-Size": str(size),
               "X-Log-Exists": "true" if exists else "false", "Cache-Control": "no-store", "Accept-Ranges": "bytes"}
    if status == 206:
        headers["Content-Range"] = f"bytes {start}-{max(start, end - 1)}/{size}"
    return Response(data.decode("utf-8", errors="replace"), status_code=status,
                    media_type="text/plain; charset=utf-8", headers=headers)


@router.get("/{job_id}/samples")
def job_samples(job_id: str, manager: ManagerDep) -> dict[str, list[dict[str, str]]]:
    """The before/after samples of a finished job (its `sample_prompts`, answered by the base model and the
    result), read from the job's `completed` event; empty while it runs or when it had none."""
    job = manager.get(job_id)
    if not job.status.is_terminal or not job.config.get("sample_prompts"):
        return {"samples": []}
    with manager.subscribe(job_id) as subscription:
        for event in subscription.replay:
            if event.kind == "completed":
                return {"samples": list(event.data.get("samples") or [])}
    return {"samples": []}
