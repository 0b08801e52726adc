"""lm-evaluation-harness's task names, as the parent can know them without importing the harness (the one rule).

A benchmark's worker indexes the ~14,700 task files lm_eval bundles once and keeps that index in the data
directory's cache (`lm_eval-tasks.json`, worker/bench.py `task_manager`), keyed by the installed lm_eval: its
version, and the place and time of its tasks folder. Once it is there, the CLI and the API read its names here
and refuse a task the harness does not have before any process starts, with the worker's own words. Without it
(no benchmark yet in this data directory, or lm_eval reinstalled since) nothing is known here, and the worker
says the same after building the index.
"""

from __future__ import annotations

import difflib
import json
import re
import threading
from importlib import metadata, util
from pathlib import Path

__all__ = ["TASK_INDEX_FILE", "UnknownTasks", "bundled_tasks", "check_tasks", "eval_task_name", "index_key",
           "unknown_task", "unknown_tasks"]

TASK_INDEX_FILE = "lm_eval-tasks.json"
HINTS = 5  # the close names an unknown task's message offers

_lock = threading.Lock()
# cache file: ((mtime, size, key), its names, or None for a file of another lm_eval or unreadable: not read again)
_read: dict[Path, tuple[tuple[int, int, str], frozenset[str] | None]] = {}


class UnknownTasks(ValueError):
    """Tasks the harness does not have (the config's field `tasks`), each with its message."""

    field = "tasks"

    def __init__(self, messages: list[str]) -> None:
        super().__init__("; ".join(f"tasks: {message}" for message in messages))
        self.messages = messages


def eval_task_name(eval_file: str | Path) -> str:
    """The task name a benchmark gives the user's eval file (worker/bench.py `custom_task` writes it)."""
    return "tunestudio_" + (re.sub(r"[^A-Za-z0-9_]", "_", Path(eval_file).stem).strip("_") or "eval")


def check_tasks(tasks: list[str], cache_dir: Path, eval_file: str | None = None) -> None:
    """Raise UnknownTasks for the tasks the cached index lacks (the eval file's own task aside: the worker adds it)."""
    own = eval_task_name(eval_file) if eval_file else None
    said = unknown_tasks([name for name in tasks if name != own], cache_dir)
    if said:
        raise UnknownTasks(said)


def bundled_tasks() -> Path | None:
    """The installed lm_eval's tasks folder, found without importing lm_eval; None when it is not installed."""
    try:
        spec = util.find_spec("lm_eval")
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(locations[0]) / "tasks" if locations else None


def index_key(bundled: Path) -> str:
    """What the cached index was built from: a reinstall or an upgrade of lm_eval changes it."""
    return f"lm_eval {metadata.version('lm_eval')} at {bundled} of {bundled.stat().st_mtime_ns}"


def unknown_task(name: str, names: list[str]) -> str:
    """The message for a task the harness does not have, with up to HINTS names near it: those that contain it,
    those that start with it first and the shortest first (`arc_eas`: arc_easy before arabic_mt_arc_easy), else
    the closest spellings (`hellaswg`: hellaswag)."""
    lower = name.lower()
    containing = sorted((t for t in names if lower in t.lower()),
                        key=lambda t: (not t.lower().startswith(lower), len(t), t))
    close = containing[:HINTS] or difflib.get_close_matches(name, names, n=HINTS, cutoff=0.8)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    return f"lm-evaluation-harness has no task or group named {name!r}{hint}"


def unknown_tasks(tasks: list[str], cache_dir: Path) -> list[str]:
    """A message for each of `tasks` the cached index lacks; none when every one is there or no current index is
    cached (the worker then decides)."""
    names = _cached_names(cache_dir)
    if names is None:
        return []
    ordered: list[str] | None = None
    said = []
    for name in tasks:
        if name not in names:
            ordered = ordered or sorted(names)
            said.append(unknown_task(name, ordered))
    return said


def _cached_names(cache_dir: Path) -> frozenset[str] | None:
    """The names in the cached index when it is the installed lm_eval's (read once per version of the file)."""
    bundled = bundled_tasks()
    path = cache_dir / TASK_INDEX_FILE
    try:
        key = index_key(bundled) if bundled is not None else None
        stat = path.stat()
    except (OSError, metadata.PackageNotFoundError):
        return None
    if key is None:
        return None
    stamp = (stat.st_mtime_ns, stat.st_size, key)
    with _lock:
        known = _read.get(path)
        if known is not None and known[0] == stamp:
            return known[1]
    names: frozenset[str] | None = None  # another lm_eval's, or unreadable: the worker builds it again
    try:
        kept = json.loads(path.read_text(encoding="utf-8"))
        if kept.get("key") == key:
            names = frozenset(str(entry[0]) for entry in kept["entries"])
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        pass
    with _lock:
        _read[path] = (stamp, names)
    return names
