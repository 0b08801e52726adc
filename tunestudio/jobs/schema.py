"""The store's tables: the SQL, the columns, and how a progress event becomes its metrics row and back.

A progress event is stored once, as its metrics row: one column per field of
`events.Progress`, so a field added there is a column here, added to older
databases on open (`ADDED_COLUMNS`).
"""

from __future__ import annotations

import json
import typing
from collections.abc import Iterable
from typing import Any

from tunestudio.events import Progress

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id            TEXT PRIMARY KEY,
    request_id    TEXT UNIQUE,
    status        TEXT NOT NULL,
    phase         TEXT,
    message       TEXT NOT NULL DEFAULT '',
    error         TEXT,
    config        TEXT NOT NULL,
    created_at    REAL NOT NULL,
    started_at    REAL,
    finished_at   REAL,
    output_dir    TEXT,
    checkpoint    TEXT,
    resumed_from  TEXT REFERENCES jobs(id),
    final_metrics TEXT,
    progress      TEXT,
    owner_pid     INTEGER,
    worker_pid    INTEGER,
    log_path      TEXT,
    last_seq      INTEGER NOT NULL DEFAULT 0,
    stop_request  TEXT,
    result        TEXT,
    kind          TEXT NOT NULL DEFAULT 'train',
    source_job    TEXT
);
CREATE INDEX IF NOT EXISTS jobs_created ON jobs (created_at);
CREATE INDEX IF NOT EXISTS jobs_status ON jobs (status);
-- metrics: one row per progress event, its columns derived from events.Progress (see PROGRESS_COLUMNS).
CREATE INDEX IF NOT EXISTS metrics_job_step ON metrics (job_id, step);
-- Events of every kind but progress; a progress event is its metrics row (seq is its place in the stream).
CREATE TABLE IF NOT EXISTS events (
    job_id TEXT NOT NULL,
    seq    INTEGER NOT NULL,
    kind   TEXT NOT NULL,
    data   TEXT NOT NULL,
    PRIMARY KEY (job_id, seq)
) WITHOUT ROWID;
"""

JOB_COLUMNS = (
    "id", "request_id", "status", "phase", "message", "error", "config", "created_at", "started_at",
    "finished_at", "output_dir", "checkpoint", "resumed_from", "final_metrics", "progress", "owner_pid",
    "worker_pid", "log_path", "last_seq", "stop_request", "result", "kind", "source_job", "name", "notes",
    "sweep_id", "trial",
)
# Every job read carries the id of the job that resumed it (at most one: a job resumes once).
JOB_SELECT = "SELECT *, (SELECT c.id FROM jobs c WHERE c.resumed_from = jobs.id LIMIT 1) AS resumed_by FROM jobs"
JSON_COLUMNS = ("config", "final_metrics", "progress", "result")
INT64_MAX = 2**63 - 1  # SQLite's largest integer


def _sql_type(annotation: Any) -> str:
    """The SQLite type of a Progress field: int/bool INTEGER, float REAL, str TEXT, anything else JSON TEXT."""
    base = next((a for a in typing.get_args(annotation) if a is not type(None)), annotation)
    return {int: "INTEGER", bool: "INTEGER", float: "REAL", str: "TEXT"}.get(base, "JSON")


# A progress event is stored once, as its metrics row: one column per field of the Progress model, so a
# field added there is a column here (tests/jobs/test_store.py checks it), and a replay rebuilds the event.
PROGRESS_TYPES = {name: _sql_type(f.annotation) for name, f in Progress.model_fields.items()
                  if name not in ("kind", "seq")}
PROGRESS_COLUMNS = tuple(PROGRESS_TYPES)
METRIC_COLUMNS = PROGRESS_COLUMNS  # a metric record is the progress event without kind and seq
_JSON_PROGRESS = tuple(name for name, kind in PROGRESS_TYPES.items() if kind == "JSON")
METRICS_TABLE = (
    "CREATE TABLE IF NOT EXISTS metrics (job_id TEXT NOT NULL, seq INTEGER, "
    + ", ".join(f"{name} {'TEXT' if kind == 'JSON' else kind}{' NOT NULL' if name == 'step' else ''}"
                for name, kind in PROGRESS_TYPES.items())
    + ")"
)
# Columns added since the first release: older databases get them (NULL in their old rows) on open.
ADDED_COLUMNS = (
    ("metrics", "seq", "INTEGER"),
    *(("metrics", name, "TEXT" if kind == "JSON" else kind) for name, kind in PROGRESS_TYPES.items()
      if name != "step"),
    ("jobs", "stop_request", "TEXT"),
    ("jobs", "result", "TEXT"),  # {"samples", "evaluation", "best"} of the job's Completed event
    # Job kinds: "train", or "export" (source_job: the job whose result it exports).
    ("jobs", "kind", "TEXT NOT NULL DEFAULT 'train'"),
    ("jobs", "source_job", "TEXT"),
    ("jobs", "name", "TEXT"),
    ("jobs", "notes", "TEXT"),
    # A sweep's trial (tunestudio/sweeps/): the sweep's id and the trial's number.
    ("jobs", "sweep_id", "TEXT"),
    ("jobs", "trial", "INTEGER"),
)


def progress_values(record: dict[str, Any]) -> list[Any]:
    return [json.dumps(record[c]) if c in _JSON_PROGRESS and record.get(c) is not None else record.get(c)
            for c in PROGRESS_COLUMNS]


def progress_record(values: Iterable[Any]) -> dict[str, Any]:
    record = dict(zip(PROGRESS_COLUMNS, values, strict=True))
    for name in _JSON_PROGRESS:
        if record[name] is not None:
            record[name] = json.loads(record[name])
    return record

