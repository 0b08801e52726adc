"""A job's artefacts on disk: recorded when its worker ends, checked and removed when it is deleted.

What a job owns is `tunestudio.ownership`'s marker in its output folder; this module applies it to the
manager's rows: sealing at exit, the exports a delete would take along, the other jobs that still use what
a delete would remove. A finished job whose folder's marker does not list it (it never took the folder, or
wrote nothing and gave it back) claims no folder: it is in no later job's way. The job's own `jobs/ID/` folder
(its log) is the manager's and goes whole.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from tunestudio import ownership
from tunestudio.jobs.models import Job, JobConflict
from tunestudio.jobs.status import JobStatus
from tunestudio.jobs.store import Store

__all__ = ["check_users", "claimed_outputs", "exports_in_the_way", "holds_folder", "owned", "remove", "seal", "take"]

log = logging.getLogger(__name__)


def take(job_id: str, output_dir: str | None) -> str | None:
    """Make the output folder the job's own before anything is written there; the reason if it cannot be."""
    if output_dir:
        try:
            ownership.take(Path(output_dir), job_id)
        except (ownership.NotOurs, OSError) as exc:
            return f"output_dir: {exc}"
    return None


def seal(job_id: str, output_dir: str | None) -> None:
    """Record what the job's worker wrote in its output folder: what delete may remove later. A job that
    wrote nothing gives the folder back at once (one it created and left empty goes)."""
    if not output_dir:
        return
    try:
        # A staging folder beside it is an export's into this folder (no two live jobs share one): the worker
        # has ended, so it is stale (killed before it could remove it). Gone first, the folders it made can go.
        ownership.discard_staging(Path(output_dir))
        if not ownership.seal(Path(output_dir), job_id):
            ownership.release(Path(output_dir), job_id)
    except OSError as exc:  # a full disk, a folder gone: delete then removes less, never more
        log.warning("job %s: recording its files in %s failed: %s", job_id, output_dir, exc)


def owned(job: Job) -> list[Path]:
    """The job's own top-level entries in its output folder, sorted: what its ownership marker lists (as the
    downloads list them), never a file the user put there, no link; none before the job ends (its worker's exit
    makes the list)."""
    if not job.output_dir:
        return []
    return sorted(path for path in ownership.files(Path(job.output_dir), job.id)
                  if not path.is_symlink() and path.exists())


def exports_in_the_way(store: Store, job_id: str, take_them: bool) -> list[dict[str, Any]]:
    """The exports of a job that deleting its artefacts concerns (running, or with files); JobConflict for a
    running one, and, unless take_them, for any (naming them: the caller may ask again with them)."""
    rows = [row for row in store.exports_of(job_id)
            if JobStatus(row["status"]).is_live or ownership.files(Path(row["output_dir"] or ""), row["id"])]
    live = [row["id"] for row in rows if JobStatus(row["status"]).is_live]
    if live:
        raise JobConflict(f"export {live[0]} of job {job_id} is running; cancel it first")
    if rows and not take_them:
        ids = [row["id"] for row in rows]
        raise JobConflict(f"job {job_id} has {len(ids)} export(s) with files ({', '.join(ids)}); delete them with "
                          "it (delete_exports) or first", exports=ids)
    return rows


def holds_folder(row: dict[str, Any], owners: dict[str, frozenset[str]] | None = None) -> bool:
    """Whether a job's row still claims its output folder: a live job's is reserved (a queued one takes it only
    at start), a finished one's only while the folder's marker lists the job. owners: markers read already."""
    folder = row.get("output_dir")
    if not folder:
        return False
    if JobStatus(row["status"]).is_live:
        return True
    if owners is None:
        return ownership.owns(Path(folder), row["id"])
    if folder not in owners:
        owners[folder] = ownership.owners(Path(folder))
    return row["id"] in owners[folder]


def claimed_outputs(store: Store) -> list[tuple[str, bool]]:
    """(output_dir, live) of the jobs that claim an output folder (`holds_folder`): what a new job's must not
    overlap."""
    owners: dict[str, frozenset[str]] = {}
    return [(row["output_dir"], JobStatus(row["status"]).is_live) for row in store.output_dirs()
            if holds_folder(row, owners)]


def check_users(store: Store, job: Job) -> None:
    """JobConflict if another job uses the job's output folder itself or something its delete would remove."""
    if not job.output_dir:
        return
    output = Path(job.output_dir).resolve()
    removed = [str(p) for p in ownership.files(output, job.id)]
    for other in store.jobs_referring_to(str(output), removed, besides=job.id):
        row = store.get_job(other)
        if row is None or _only_through_a_folder_it_gave_up(row, job.id, output, removed):
            continue
        raise JobConflict(f"job {other} still refers to {output}; delete it first, or delete this job without "
                          "its artefacts")


def _only_through_a_folder_it_gave_up(row: dict[str, Any], job_id: str, output: Path, removed: list[str]) -> bool:
    """Whether another job refers to what a delete touches only by an output folder it does not hold: it did not
    resume the job, and the checkpoint it resumed from (if any) is neither the folder nor inside what goes."""
    if row.get("resumed_from") == job_id or holds_folder(row):
        return False
    checkpoint = (row.get("config") or {}).get("resume_from_checkpoint")
    if not checkpoint or checkpoint == "latest":
        return True
    path = Path(checkpoint).resolve()
    return path != output and not any(path.is_relative_to(Path(p).resolve()) for p in removed)


def remove(job: Job, jobs_dir: Path) -> None:
    """Remove what the job wrote (only that: ownership.release), a staging folder it left (only one tunestudio
    made), and its jobs/ID folder."""
    if job.output_dir:
        if job.kind == "export":  # first: then the folders the export made can go
            ownership.discard_staging(Path(job.output_dir).resolve())
        ownership.release(Path(job.output_dir).resolve(), job.id)
    shutil.rmtree(jobs_dir / job.id, ignore_errors=True)
