"""A job's artefacts on disk: recorded when its worker ends, checked and removed when it is deleted.

What a job owns is `tunestudio.ownership`'s marker in its output folder; this module applies it to the
manager's rows: sealing at exit, the exports a delete would take along, the other jobs that still use what
a delete would remove. The job's own `jobs/ID/` folder (its log) is the manager's and goes whole.
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

__all__ = ["check_users", "exports_in_the_way", "remove", "seal", "take"]

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
        if not ownership.seal(Path(output_dir), job_id):
            ownership.release(Path(output_dir), job_id)
    except OSError as exc:  # a full disk, a folder gone: delete then removes less, never more
        log.warning("job %s: recording its files in %s failed: %s", job_id, output_dir, exc)


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


def check_users(store: Store, job: Job) -> None:
    """JobConflict if another job uses the job's output folder itself or something its delete would remove."""
    if not job.output_dir:
        return
    output = Path(job.output_dir).resolve()
    removed = [str(p) for p in ownership.files(output, job.id)]
    for other in store.jobs_referring_to(str(output), removed, besides=job.id):
        raise JobConflict(f"job {other} still refers to {output}; delete it first, or delete this job without "
                          "its artefacts")


def remove(job: Job, jobs_dir: Path) -> None:
    """Remove what the job wrote (only that: ownership.release) and its jobs/ID folder."""
    if job.output_dir:
        ownership.release(Path(job.output_dir).resolve(), job.id)
    shutil.rmtree(jobs_dir / job.id, ignore_errors=True)
