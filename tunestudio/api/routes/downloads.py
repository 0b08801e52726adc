"""A job's files from the browser: its weights as a zip, the files of its output folder (an export's), its metrics as
CSV. (Its worker log: GET /api/jobs/{id}/log?download=true, routes/logs.py.)

Everything comes from the job's own output folder, listed the same way every time (`job_files`): the regular files
the job wrote there (what its ownership marker lists as its own, `tunestudio.ownership.files`: never a file the
user put in the folder, nor anything of a folder the job never took), nothing hidden (the ownership marker, a
staging or `.partial` folder), no symbolic link. A file is served only when its name is one of that list, so no
name reaches outside the folder. The weights zip is streamed, a file
at a time in 1 MiB pieces, never held whole in memory. File names keep their Unicode (RFC 5987 `filename*`, with
an ASCII `filename` beside it for old clients).
"""

from __future__ import annotations

import csv
import io
import os
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Response
from fastapi import Path as PathParam
from fastapi.responses import FileResponse, StreamingResponse
from pydantic import BaseModel, Field

from tunestudio import ownership
from tunestudio.api.deps import ManagerDep
from tunestudio.api.errors import ApiError
from tunestudio.api.schemas import ERRORS
from tunestudio.events import Progress
from tunestudio.inference import weights_folder
from tunestudio.jobs import Job, JobManager

router = APIRouter(prefix="/api/jobs", tags=["downloads"], responses=ERRORS)

CHUNK = 1 << 20
MAX_FILES = 5000  # a listing stops here (a folder of thousands of checkpoints is not a download list)
MAX_EXPORTS = 200  # the newest jobs searched for a job's exports
STORED = (".safetensors", ".bin", ".gguf", ".pt", ".pth", ".zip", ".gz")  # already dense: not compressed again
_UNSAFE = re.compile(r"[\x00-\x1f\x7f/\\]")


class FileOut(BaseModel):
    name: str = Field(description="Its path inside the job's output folder (GET .../files/{name}).")
    bytes: int


class WeightsOut(BaseModel):
    kind: str = Field(description='"adapter" (LoRA/QLoRA) or "model" (a full fine-tune).')
    filename: str = Field(description="The zip's name.")
    files: list[FileOut]
    bytes: int = Field(description="The files' size together (the zip is about this big: weights are stored).")


class ExportFiles(BaseModel):
    id: str
    status: str
    target: str | None = None
    quantization: str | None = None
    files: list[FileOut]


class DownloadsOut(BaseModel):
    job_id: str
    weights: WeightsOut | None = Field(description="The job's adapter or model; None when it has no result.")
    weights_note: str | None = Field(default=None, description="Why there are no weights to download.")
    files: list[FileOut] = Field(description="Every file of the job's output folder (an export's result).")
    exports: list[ExportFiles] = Field(description="A training job's exports and their files.")
    metrics: int = Field(description="Metric records: rows of GET .../metrics.csv.")
    log: bool = Field(description="Whether the worker log exists (GET .../log?download=true).")


def content_disposition(filename: str) -> str:
    """`attachment` with the name in UTF-8 (RFC 5987 / 6266) and an ASCII stand-in for clients without it."""
    fallback = "".join(c if 32 <= ord(c) < 127 and c not in '"\\%' else "_" for c in filename)
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(filename, safe='')}"


def _label(job: Job) -> str:
    """The job as a file name: its name (Unicode kept, no path separator or control character), else its id."""
    name = _UNSAFE.sub("_", (job.name or "").strip()).strip(". ")
    return name[:100] or job.id


def regular_file_in(path: Path, folder: Path) -> bool:
    """Whether `path` may be served as a file of `folder`: a regular file, neither it nor the folder a link, whose
    resolved path is inside the folder's (the rule of every route that sends a job's file: its output files, its
    worker log)."""
    try:
        if folder.is_symlink() or path.is_symlink() or not path.is_file():
            return False
        path.resolve().relative_to(folder.resolve())
    except (OSError, ValueError):  # gone meanwhile, or outside the folder
        return False
    return True


def job_files(job: Job, folder: Path | None = None) -> dict[str, Path]:
    """name → path of every regular file the job wrote under `folder` (its output folder unless given; names
    relative to it, '/' between parts), sorted: only under the entries its ownership marker lists as its own."""
    if not job.output_dir:
        return {}
    output = Path(job.output_dir)
    root = folder or output
    mine = {path.name for path in ownership.files(output, job.id)}
    try:
        top = root.resolve().relative_to(output.resolve()).parts[:1]
    except (OSError, ValueError):  # not inside the job's folder
        return {}
    if not mine or root.is_symlink() or not root.is_dir() or (top and top[0] not in mine):
        return {}
    found: dict[str, Path] = {}
    for here, dirs, names in os.walk(root):  # os.walk does not follow links to folders
        at_top = not top and Path(here) == root  # the output folder itself: only the job's entries
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and (not at_top or d in mine))
        for name in sorted(names):
            path = Path(here) / name
            if name.startswith(".") or (at_top and name not in mine) or not regular_file_in(path, output):
                continue
            found[path.relative_to(root).as_posix()] = path
            if len(found) >= MAX_FILES:
                return found
    return found


def _listed(files: dict[str, Path]) -> list[FileOut]:
    out = []
    for name, path in files.items():
        try:
            out.append(FileOut(name=name, bytes=path.stat().st_size))
        except OSError:
            continue
    return out


def _weights(job: Job) -> tuple[Path, dict[str, Path]] | str:
    """The folder with the job's final weights and its top-level files, or why there are none."""
    if not job.spec.trains:
        return f"a{'n' if job.kind == 'export' else ''} {job.kind} job has no adapter or model of its own; " \
               "download its files"
    if not job.has_result:
        return f"job {job.id} has no result to download: it is {job.status.value}" + (
            "" if job.is_terminal else " (the weights come when it completes, or when it is stopped with a save)")
    folder = weights_folder(job)
    files = {name: path for name, path in job_files(job, folder).items() if "/" not in name} if folder else {}
    if folder is None or not files:
        return f"job {job.id} has no weights on disk any more: its output folder holds no adapter or model"
    return folder, files


def _kind(files: dict[str, Path]) -> str:
    return "adapter" if "adapter_config.json" in files else "model"


def _exports(manager: JobManager, job: Job) -> list[ExportFiles]:
    if not job.spec.trains:
        return []
    found = [j for j in manager.list(limit=MAX_EXPORTS) if j.kind == "export" and j.source_job == job.id]
    return [ExportFiles(id=j.id, status=j.status.value, target=j.config.target,
                        quantization=j.config.quantization,
                        files=_listed(job_files(j)) if j.is_terminal else [])
            for j in reversed(found)]


@router.get("/{job_id}/downloads", response_model=DownloadsOut)
def downloads(job_id: str, manager: ManagerDep) -> DownloadsOut:
    """What the job has to download: its weights (a zip), its output folder's files, its exports' files, its
    metrics (CSV) and its log."""
    job = manager.get(job_id)
    found = _weights(job)
    weights = None
    if not isinstance(found, str):
        _, files = found
        listed = _listed(files)
        weights = WeightsOut(kind=_kind(files), filename=f"{_label(job)}-{_kind(files)}.zip", files=listed,
                             bytes=sum(f.bytes for f in listed))
    return DownloadsOut(
        job_id=job.id, weights=weights, weights_note=found if isinstance(found, str) else None,
        files=_listed(job_files(job)) if job.is_terminal else [], exports=_exports(manager, job),
        metrics=len(manager.metrics(job_id)) if job.spec.trains else 0,
        log=bool(job.log_path) and regular_file_in(Path(job.log_path or ""), manager.settings.jobs_dir() / job.id))


class _Sink(io.RawIOBase):
    """Where zipfile writes: it keeps what was written until the stream takes it. It cannot seek, so zipfile
    writes each entry's sizes after its data (a data descriptor) and never goes back."""

    def __init__(self) -> None:
        super().__init__()
        self._parts: list[bytes] = []
        self._written = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        part = bytes(data)
        self._parts.append(part)
        self._written += len(part)
        return len(part)

    def tell(self) -> int:
        return self._written

    def take(self) -> bytes:
        out = b"".join(self._parts)
        self._parts.clear()
        return out


def zip_stream(files: dict[str, Path]) -> Iterator[bytes]:
    """A zip of these files (name → path), produced a piece at a time."""
    sink = _Sink()
    with zipfile.ZipFile(sink, "w", allowZip64=True) as archive:
        for name, path in files.items():
            info = zipfile.ZipInfo.from_file(path, arcname=name)
            info.compress_type = zipfile.ZIP_STORED if name.endswith(STORED) else zipfile.ZIP_DEFLATED
            with path.open("rb") as source, archive.open(info, "w") as target:
                while chunk := source.read(CHUNK):
                    target.write(chunk)
                    if piece := sink.take():
                        yield piece
            if piece := sink.take():
                yield piece
    yield sink.take()


@router.get("/{job_id}/download", response_class=StreamingResponse,
            responses={200: {"content": {"application/zip": {}}}, 409: {"description": "The job has no result."}})
def download_weights(job_id: str, manager: ManagerDep) -> StreamingResponse:
    """The job's adapter or model (the top-level files of its output folder: weights, tokenizer, configs) as a zip,
    streamed; 409 when the job has no result (running, failed, cancelled, an export...), saying why."""
    job = manager.get(job_id)
    found = _weights(job)
    if isinstance(found, str):
        raise ApiError(409, "conflict", found, field="job_id")
    _, files = found
    filename = f"{_label(job)}-{_kind(files)}.zip"
    return StreamingResponse(zip_stream(files), media_type="application/zip",
                             headers={"Content-Disposition": content_disposition(filename),
                                      "Cache-Control": "no-store"})


@router.get("/{job_id}/files", response_model=list[FileOut])
def list_files(job_id: str, manager: ManagerDep) -> list[FileOut]:
    """Every file the job wrote in its output folder, with its size (an export's result: a merged model, a GGUF
    file...); a file the user put there is not the job's."""
    return _listed(job_files(manager.get(job_id)))


@router.get("/{job_id}/files/{name:path}", response_class=FileResponse,
            responses={200: {"content": {"application/octet-stream": {}}}})
def download_file(job_id: str, name: Annotated[str, PathParam(max_length=4096)], manager: ManagerDep) -> FileResponse:
    """One file of the job's output folder, by its name in GET .../files; any other name is a 404."""
    path = job_files(manager.get(job_id)).get(name)
    if path is None:
        raise ApiError(404, "not_found", f"job {job_id} has no file {name[:200]!r}", field="name")
    return FileResponse(path, media_type="application/octet-stream",
                        headers={"Content-Disposition": content_disposition(path.name), "Cache-Control": "no-store"})


# The CSV's columns: every field of a metric record (Progress), step first; then the method's own metrics.
CSV_FIELDS = ("step", *(f for f in Progress.model_fields if f not in ("kind", "seq", "step", "extra")))


def metrics_csv(records: list[dict[str, Any]]) -> str:
    """One row per metric record (a training step's, or an evaluation's), the method's metrics as extra columns."""
    extra = sorted({key for record in records for key in (record.get("extra") or {}) if key not in CSV_FIELDS})
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*CSV_FIELDS, *extra])
    for record in records:
        values = {**(record.get("extra") or {}), **{k: v for k, v in record.items() if k != "extra"}}
        writer.writerow(["" if values.get(c) is None else values[c] for c in (*CSV_FIELDS, *extra)])
    return out.getvalue()


@router.get("/{job_id}/metrics.csv", response_class=Response, responses={200: {"content": {"text/csv": {}}}})
def download_metrics(job_id: str, manager: ManagerDep) -> Response:
    """Every metric record of the job as CSV (loss, eval metrics, learning rate, ... over steps), as logged."""
    job = manager.get(job_id)
    return Response(metrics_csv(manager.metrics(job_id)), media_type="text/csv; charset=utf-8",
                    headers={"Content-Disposition": content_disposition(f"{_label(job)}-metrics.csv"),
                             "Cache-Control": "no-store"})
