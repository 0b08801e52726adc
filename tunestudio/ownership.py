"""What a job owns in its output folder, so that deleting it removes only that.

A job takes its output folder before its worker starts (`take`): it creates the
folder (and says which of its parents it created), or finds it empty, or finds
it to be an earlier tunestudio output (it carries `MARKER`). A folder holding
anything else is not taken: `NotOurs`. The marker records, per job, what the
folder held when the job took it; when the job ends (`seal`) the entries that
appeared since are the job's manifest. `release` (delete with artefacts)
removes only the job's manifest, then the folder and the parents the job
created if they are left empty. Without the job's own entry in the marker
nothing is removed. A job that writes a folder's contents elsewhere first
(an export) stages them in `.NAME.partial` beside it (`stage`), marked inside
with `PARTIAL`, so that only a staging folder tunestudio made is ever removed
(`discard_staging`: what a killed export left).

Stdlib only: the parent (the manager, at start, exit and delete) and the
worker (an export moves the marker into its new folder) both use it.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["MARKER", "PARTIAL", "NotOurs", "check", "discard_staging", "files", "owners", "owns", "release",
           "replaced", "seal", "stage", "staging", "take"]

MARKER = ".tunestudio-owner.json"
PARTIAL = ".tunestudio-partial"  # inside a staging folder: tunestudio made it and may remove it


class NotOurs(ValueError):
    """A folder that holds files tunestudio did not write: no job may take it."""


def _read(folder: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("jobs"), dict) else None


def _write(folder: Path, data: dict[str, Any]) -> None:
    tmp = folder / f"{MARKER}.tmp"
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, folder / MARKER)


def _entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name not in (MARKER, f"{MARKER}.tmp"))


def check(folder: Path) -> None:
    """Raise NotOurs unless a job could take this folder (missing, empty, or an earlier tunestudio output)."""
    if not folder.exists():
        return
    if not folder.is_dir():
        raise NotOurs(f"{folder} exists and is not a folder")
    if _read(folder) is None and _entries(folder):
        raise NotOurs(f"{folder} already holds files tunestudio did not write; choose a new or empty folder "
                      "(tunestudio never writes into, or deletes, a folder it did not create)")


def take(folder: Path, job_id: str) -> None:
    """Make `folder` (absolute) the job's output folder and mark it; raises NotOurs (nothing written) if it
    holds files tunestudio did not write."""
    check(folder)
    made: list[str] = []  # the parents this job creates, deepest first
    created = not folder.exists()
    if created:
        parent = folder.parent
        while not parent.exists():
            made.append(str(parent))
            parent = parent.parent
        folder.mkdir(parents=True)
    data = _read(folder) or {"created_by": job_id if created else None, "jobs": {}}
    data["jobs"][job_id] = {"before": _entries(folder), "files": [], "parents": made}
    _write(folder, data)


def seal(folder: Path, job_id: str) -> list[str]:
    """Record what appeared in the folder since the job took it as the job's files (kept across calls)."""
    data = _read(folder) if folder.is_dir() else None
    if data is None or job_id not in data["jobs"]:
        return []
    mine = data["jobs"][job_id]
    others = {name for other, entry in data["jobs"].items() if other != job_id for name in entry.get("files", ())}
    new = set(_entries(folder)) - set(mine.get("before", ())) - others
    mine["files"] = sorted(set(mine.get("files", ())) | new)
    _write(folder, data)
    return mine["files"]


def owns(folder: Path, job_id: str) -> bool:
    return job_id in owners(folder)


def owners(folder: Path) -> frozenset[str]:
    """The jobs the folder's marker lists: those that took it and have not handed it back."""
    data = _read(folder) if folder.is_dir() else None
    return frozenset(data["jobs"]) if data is not None else frozenset()


def replaced(folder: Path, names: Iterable[str]) -> None:
    """The caller (a job that took the folder) replaces these entries with its own: no job's manifest lists them
    any more, and they are not what the folder held before, so the caller's `seal` records the new ones."""
    data = _read(folder) if folder.is_dir() else None
    gone = set(names)
    if data is None or not gone:
        return
    for entry in data["jobs"].values():
        entry["files"] = [name for name in entry.get("files", ()) if name not in gone]
        entry["before"] = [name for name in entry.get("before", ()) if name not in gone]
    _write(folder, data)


def files(folder: Path, job_id: str) -> list[Path]:
    """The job's manifest in its folder: what `release` would remove (the folder too when it made it)."""
    data = _read(folder) if folder.is_dir() else None
    if data is None or job_id not in data["jobs"]:
        return []
    return [folder / name for name in data["jobs"][job_id].get("files", ())]


def release(folder: Path, job_id: str) -> list[Path]:
    """Remove what the job wrote in its folder (its manifest), then the folder and the parents it created
    if they are left empty. Returns what was removed; a folder without the job's entry is left as it is."""
    data = _read(folder) if folder.is_dir() else None
    if data is None or job_id not in data["jobs"]:
        return []
    mine = data["jobs"].pop(job_id)
    removed = []
    for name in mine.get("files", ()):
        path = folder / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists() or path.is_symlink():
            path.unlink(missing_ok=True)
        removed.append(path)
    if data["jobs"]:
        _write(folder, data)
        return removed
    if _entries(folder) or data.get("created_by") != job_id:
        (folder / MARKER).unlink(missing_ok=True)  # no job left in it: the folder is the user's again
        return removed
    (folder / MARKER).unlink(missing_ok=True)
    folder.rmdir()
    removed.append(folder)
    for parent in mine.get("parents", ()):  # deepest first, as take() found them missing
        try:
            Path(parent).rmdir()
        except OSError:  # not empty (another export in exports/, a file the user put there): it stays
            break
        removed.append(Path(parent))
    return removed


def staging(folder: Path) -> Path:
    """Where a job stages `folder`'s contents before moving them in: `.NAME.partial` beside it."""
    return folder.parent / f".{folder.name}.partial"


def stage(folder: Path) -> Path:
    """A fresh, empty staging folder for `folder`, marked as tunestudio's (its parents created as needed). One a
    killed job left is removed first; NotOurs (nothing removed) if something tunestudio did not make is there."""
    path = staging(folder)
    discard_staging(folder)
    if path.exists() or path.is_symlink():
        raise NotOurs(f"{path} is in the way and tunestudio did not make it; move it away or choose another folder")
    path.mkdir(parents=True)
    (path / PARTIAL).touch()
    return path


def discard_staging(folder: Path) -> bool:
    """Remove `folder`'s staging folder if tunestudio made it (it holds PARTIAL): what a killed job left there.
    Anything else of that name stays. True if one was removed."""
    path = staging(folder)
    if path.is_symlink() or not (path / PARTIAL).is_file():
        return False
    shutil.rmtree(path, ignore_errors=True)
    return True
