"""Every job's record, metrics and events, in SQLite (WAL) under the data directory.

One writer thread owns the only write connection and commits in batches:
whatever is queued when it wakes goes into one transaction. `flush()` waits
until everything queued before it is committed; writes that must be durable
before they are reported (a new job, a final status) pass `wait=True`.
Readers use their own connection per thread; WAL lets them read while the
writer writes.
"""

from __future__ import annotations

import heapq
import json
import logging
import sqlite3
import threading
import typing
from collections.abc import Iterable
from itertools import islice
from operator import itemgetter
from pathlib import Path
from queue import SimpleQueue
from typing import Any

from tunestudio.events import Progress

log = logging.getLogger(__name__)

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
    stop_request  TEXT
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
    "worker_pid", "log_path", "last_seq", "stop_request", "name", "notes",
)
# Every job read carries the id of the job that resumed it (at most one: a job resumes once).
_JOB_SELECT = "SELECT *, (SELECT c.id FROM jobs c WHERE c.resumed_from = jobs.id LIMIT 1) AS resumed_by FROM jobs"
JSON_COLUMNS = ("config", "final_metrics", "progress")
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
_ADDED_COLUMNS = (
    ("metrics", "seq", "INTEGER"),
    *(("metrics", name, "TEXT" if kind == "JSON" else kind) for name, kind in PROGRESS_TYPES.items()
      if name != "step"),
    ("jobs", "stop_request", "TEXT"),
    ("jobs", "name", "TEXT"),
    ("jobs", "notes", "TEXT"),
)


def _progress_values(record: dict[str, Any]) -> list[Any]:
    return [json.dumps(record[c]) if c in _JSON_PROGRESS and record.get(c) is not None else record.get(c)
            for c in PROGRESS_COLUMNS]


def _progress_record(values: Iterable[Any]) -> dict[str, Any]:
    record = dict(zip(PROGRESS_COLUMNS, values, strict=True))
    for name in _JSON_PROGRESS:
        if record[name] is not None:
            record[name] = json.loads(record[name])
    return record


class DuplicateRequest(Exception):
    """A job with this client request id exists already."""

    def __init__(self, job_id: str) -> None:
        super().__init__(job_id)
        self.job_id = job_id


def _encode(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: json.dumps(v) if k in JSON_COLUMNS and v is not None else v for k, v in fields.items()}


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


def _decode(row: sqlite3.Row) -> dict[str, Any]:
    out = dict(row)
    for key in JSON_COLUMNS:
        if out.get(key) is not None:
            out[key] = json.loads(out[key])
    return out


class Store:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._ops: SimpleQueue[tuple[Any, ...]] = SimpleQueue()
        self._closed = False
        writer = self._connect()
        writer.executescript(SCHEMA.replace("-- metrics:", METRICS_TABLE + ";\n-- metrics:", 1))
        for table, name, sql_type in _ADDED_COLUMNS:
            if name not in _columns(writer, table):
                # An older database. Its metrics rows keep seq NULL: their progress events stay in `events`.
                try:
                    writer.execute(f"ALTER TABLE {table} ADD COLUMN {name} {sql_type}")
                except sqlite3.OperationalError:
                    if name not in _columns(writer, table):  # not another process (a server, a CLI) adding it first
                        raise
        writer.execute("CREATE INDEX IF NOT EXISTS metrics_job_seq ON metrics (job_id, seq)")
        writer.execute("CREATE INDEX IF NOT EXISTS jobs_resumed_from ON jobs (resumed_from)")
        writer.commit()
        self._writer = threading.Thread(target=self._write_loop, args=(writer,), name="store-writer", daemon=True)
        self._writer.start()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30, check_same_thread=False, isolation_level="DEFERRED")
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: a commit survives a process crash
        conn.execute("PRAGMA foreign_keys=ON")
        return conn

    def _reader(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._connect()
        return conn

    # --- the writer ------------------------------------------------------------
    def _write_loop(self, conn: sqlite3.Connection) -> None:
        metric_sql = (
            f"INSERT INTO metrics (job_id, seq, {', '.join(PROGRESS_COLUMNS)}) "
            f"VALUES ({', '.join('?' * (len(PROGRESS_COLUMNS) + 2))})"
        )
        while True:
            batch = [self._ops.get()]
            while not self._ops.empty() and len(batch) < 20_000:
                batch.append(self._ops.get())
            done: list[threading.Event] = []
            results: list[tuple[dict[str, Any], BaseException]] = []
            stop = False
            # Appends and updates are gathered until a barrier (insert, delete, flush, close)
            # and written as one executemany per table and one UPDATE per job.
            events: list[tuple] = []
            metrics: list[tuple] = []
            updates: dict[str, dict[str, Any]] = {}

            try:
                for op in batch:
                    kind = op[0]
                    if kind == "append":
                        _, job_id, event_rows, metric_rows, fields = op
                        events.extend(event_rows)
                        metrics.extend(metric_rows)
                        if fields:
                            updates.setdefault(job_id, {}).update(fields)
                        continue
                    if kind == "update":  # coalesce: the latest value of each field wins
                        updates.setdefault(op[1], {}).update(op[2])
                        continue
                    self._write_pending(conn, metric_sql, events, metrics, updates)
                    if kind == "insert":
                        try:
                            conn.execute(
                                f"INSERT INTO jobs ({', '.join(op[1])}) VALUES ({', '.join('?' * len(op[1]))})",
                                tuple(op[1].values()),
                            )
                        except sqlite3.IntegrityError as exc:
                            results.append((op[2], exc))
                    elif kind == "clear_request":  # only if it is still what the reader saw
                        _, job_id, wanted, box = op
                        cur = conn.execute("UPDATE jobs SET stop_request = NULL WHERE id = ? AND stop_request = ?",
                                           (job_id, wanted))
                        box["taken"] = cur.rowcount == 1
                    elif kind == "delete":
                        for table, column in (("events", "job_id"), ("metrics", "job_id"), ("jobs", "id")):
                            conn.execute(f"DELETE FROM {table} WHERE {column} = ?", (op[1],))
                    elif kind == "flush":
                        done.append(op[1])
                    elif kind == "close":
                        stop = True
                self._write_pending(conn, metric_sql, events, metrics, updates)
                conn.commit()
            except sqlite3.Error as exc:  # keep the writer alive; report to waiters
                log.error("store write failed: %s", exc)
                conn.rollback()
                for op in batch:
                    if op[0] == "insert":
                        results.append((op[2], exc))
            for box, exc in results:
                box["error"] = exc
            for event in done:
                event.set()
            if stop:
                conn.close()
                return

    def _write_pending(
        self, conn: sqlite3.Connection, metric_sql: str, events: list, metrics: list, updates: dict
    ) -> None:
        if events:
            conn.executemany("INSERT OR IGNORE INTO events VALUES (?, ?, ?, ?)", events)
            events.clear()
        if metrics:
            conn.executemany(metric_sql, metrics)
            metrics.clear()
        if updates:
            self._apply_updates(conn, updates)
            updates.clear()

    @staticmethod
    def _apply_updates(conn: sqlite3.Connection, updates: dict[str, dict[str, Any]]) -> None:
        for job_id, fields in updates.items():
            fields = _encode(fields)
            assignments = ", ".join(f"{k} = ?" for k in fields)
            conn.execute(f"UPDATE jobs SET {assignments} WHERE id = ?", (*fields.values(), job_id))

    def flush(self, timeout: float = 30.0) -> None:
        """Return once everything queued before this call is committed."""
        event = threading.Event()
        self._ops.put(("flush", event))
        if not event.wait(timeout):
            raise TimeoutError("the store did not commit within the timeout")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.flush()
            self._ops.put(("close",))
            self._writer.join(timeout=10)

    # --- writes ----------------------------------------------------------------
    def insert_job(self, fields: dict[str, Any]) -> None:
        """Insert a job row and wait until it is committed; raises DuplicateRequest."""
        unknown = set(fields) - set(JOB_COLUMNS)
        assert not unknown, unknown
        box: dict[str, Any] = {}
        self._ops.put(("insert", _encode(fields), box))
        self.flush()
        if "error" in box:
            error = box["error"]
            if isinstance(error, sqlite3.IntegrityError) and fields.get("request_id"):
                existing = self.find_by_request_id(fields["request_id"])
                if existing is not None:
                    raise DuplicateRequest(existing["id"])
            raise error

    def update_job(self, job_id: str, wait: bool = False, **fields: Any) -> None:
        unknown = set(fields) - set(JOB_COLUMNS)
        assert not unknown, unknown
        self._ops.put(("update", job_id, fields))
        if wait:
            self.flush()

    def append(
        self,
        job_id: str,
        events: Iterable[tuple[int, str, str]] = (),
        metrics: Iterable[tuple[int, dict[str, Any]]] = (),
        **fields: Any,
    ) -> None:
        """One job's new events and field updates, as one write.

        events: (seq, kind, data_json) of any kind but progress; metrics:
        (seq, record) of progress events, each stored once, as its metrics row.
        """
        unknown = set(fields) - set(JOB_COLUMNS)
        assert not unknown, unknown
        self._ops.put((
            "append",
            job_id,
            [(job_id, seq, kind, data) for seq, kind, data in events],
            [(job_id, seq, *_progress_values(r)) for seq, r in metrics],
            fields,
        ))

    def take_stop_request(self, job_id: str, wanted: str) -> bool:
        """Clear a job's stop request if it is still `wanted`; False if another process changed it meanwhile."""
        box: dict[str, Any] = {}
        self._ops.put(("clear_request", job_id, wanted, box))
        self.flush()
        return bool(box.get("taken"))

    def delete_job(self, job_id: str) -> None:
        self._ops.put(("delete", job_id))
        self.flush()

    # --- reads -----------------------------------------------------------------
    def get_job(self, job_id: str) -> dict[str, Any] | None:
        row = self._reader().execute(f"{_JOB_SELECT} WHERE id = ?", (job_id,)).fetchone()
        return _decode(row) if row else None

    def find_by_request_id(self, request_id: str) -> dict[str, Any] | None:
        row = self._reader().execute(f"{_JOB_SELECT} WHERE request_id = ?", (request_id,)).fetchone()
        return _decode(row) if row else None

    def list_jobs(
        self, statuses: Iterable[str] | None = None, limit: int = 50, offset: int = 0, oldest_first: bool = False
    ) -> list[dict[str, Any]]:
        where, args = "", []
        wanted = list(statuses or [])
        if wanted:
            where = f"WHERE status IN ({', '.join('?' * len(wanted))})"
            args = wanted
        order = "ASC" if oldest_first else "DESC"
        rows = self._reader().execute(
            f"{_JOB_SELECT} {where} ORDER BY created_at {order}, rowid {order} LIMIT ? OFFSET ?",
            (*args, limit, offset),
        ).fetchall()
        return [_decode(r) for r in rows]

    def queued_owners_before(self, created_at: float) -> list[int | None]:
        """The owner pids of the jobs queued before `created_at` (oldest first)."""
        rows = self._reader().execute(
            "SELECT owner_pid FROM jobs WHERE status = 'queued' AND created_at < ? ORDER BY created_at",
            (created_at,),
        ).fetchall()
        return [r[0] for r in rows]

    def stop_requests(self, owner_pid: int) -> list[tuple[str, str]]:
        """(job id, "stop" or "cancel") asked by other processes for the jobs this process owns."""
        rows = self._reader().execute(
            "SELECT id, stop_request FROM jobs WHERE owner_pid = ? AND stop_request IS NOT NULL", (owner_pid,)
        ).fetchall()
        return [(r[0], r[1]) for r in rows]

    def count_jobs(self, statuses: Iterable[str] | None = None) -> int:
        wanted = list(statuses or [])
        if wanted:
            sql = f"SELECT COUNT(*) FROM jobs WHERE status IN ({', '.join('?' * len(wanted))})"
            return self._reader().execute(sql, wanted).fetchone()[0]
        return self._reader().execute("SELECT COUNT(*) FROM jobs").fetchone()[0]

    def events_after(
        self, job_id: str, after_seq: int = 0, limit: int = 1_000_000, upto: int | None = None
    ) -> list[tuple[int, str, str | None, dict[str, Any] | None]]:
        """The job's stream in (after_seq, upto], in seq order, at most `limit` events: (seq, kind, data_json,
        None) for stored events, (seq, "progress", None, data) for progress events rebuilt from their metrics rows."""
        conn = self._reader()
        cursor = conn.cursor()
        cursor.row_factory = None
        bound = (job_id, after_seq, INT64_MAX if upto is None else upto, limit)
        # One read transaction, so both tables are read at the same snapshot: another process committing
        # between the two queries could otherwise leave a hole in the merged stream.
        conn.execute("BEGIN")
        try:
            events = cursor.execute(
                "SELECT seq, kind, data, NULL FROM events WHERE job_id = ? AND seq > ? AND seq <= ? "
                "ORDER BY seq LIMIT ?",
                bound,
            ).fetchall()
            rows = cursor.execute(
                f"SELECT seq, {', '.join(PROGRESS_COLUMNS)} FROM metrics "
                "WHERE job_id = ? AND seq > ? AND seq <= ? ORDER BY seq LIMIT ?",
                bound,
            ).fetchall()
        finally:
            conn.rollback()  # nothing was written: this only ends the snapshot
        progress = [
            (row[0], "progress", None, {"kind": "progress", **_progress_record(row[1:])})
            for row in rows
        ]
        return list(islice(heapq.merge(events, progress, key=itemgetter(0)), limit))

    def metric_index(
        self, job_id: str, since_step: int | None = None, after: tuple[int, int] | None = None
    ) -> list[tuple[int, int, Any, Any]]:
        """(rowid, step, loss, eval_loss) per record in step order: enough to choose what a chart shows.

        after: (step, rowid) of the last row already read; only later rows come back (a job's steps never go down).
        """
        sql = "SELECT rowid, step, loss, eval_loss FROM metrics WHERE job_id = ?"
        args: list[Any] = [job_id]
        if since_step is not None:
            sql += " AND step > ?"
            args.append(since_step)
        if after is not None:
            sql += " AND (step, rowid) > (?, ?)"
            args.extend(after)
        conn = self._reader()
        cursor = conn.cursor()
        cursor.row_factory = None  # plain tuples: no per-row objects for 100k rows
        return cursor.execute(sql + " ORDER BY step, rowid", args).fetchall()

    def metric_rows(self, rowids: list[int]) -> dict[int, dict[str, Any]]:
        """The full records of the given rows, by rowid (a row deleted meanwhile is missing)."""
        out: dict[int, dict[str, Any]] = {}
        conn = self._reader()
        for start in range(0, len(rowids), 900):  # SQLite's bound-parameter limit
            chunk = rowids[start : start + 900]
            rows = conn.execute(
                f"SELECT rowid AS rid, {', '.join(METRIC_COLUMNS)} FROM metrics "
                f"WHERE rowid IN ({', '.join('?' * len(chunk))})",
                chunk,
            ).fetchall()
            for row in rows:
                out[row[0]] = _progress_record(tuple(row)[1:])
        return out

    def metrics(self, job_id: str, since_step: int | None = None) -> list[dict[str, Any]]:
        sql = f"SELECT {', '.join(METRIC_COLUMNS)} FROM metrics WHERE job_id = ?"
        args: list[Any] = [job_id]
        if since_step is not None:
            sql += " AND step > ?"
            args.append(since_step)
        rows = self._reader().execute(sql + " ORDER BY step, rowid", args).fetchall()
        return [_progress_record(tuple(r)) for r in rows]

    def output_dirs(self) -> list[dict[str, Any]]:
        """(id, status, output_dir) of every job with an output folder."""
        rows = self._reader().execute("SELECT id, status, output_dir FROM jobs WHERE output_dir IS NOT NULL")
        return [dict(r) for r in rows.fetchall()]

    def resumed_by(self, job_id: str) -> str | None:
        """The job that resumed this one, if any."""
        row = self._reader().execute("SELECT id FROM jobs WHERE resumed_from = ? LIMIT 1", (job_id,)).fetchone()
        return row[0] if row else None

    def jobs_referring_to(self, folder: str, besides: str) -> list[str]:
        """Other jobs whose output folder or checkpoint lies in `folder`, or that it lies in, or resumed `besides`."""
        target = Path(folder).resolve()
        found = []
        rows = self._reader().execute("SELECT id, output_dir, resumed_from, config FROM jobs WHERE id != ?", (besides,))
        for row in rows.fetchall():
            config = json.loads(row["config"]) if row["config"] else {}
            used = [p for p in (row["output_dir"], config.get("resume_from_checkpoint")) if p and p != "latest"]
            if row["resumed_from"] == besides or any(
                Path(p).resolve().is_relative_to(target) or target.is_relative_to(Path(p).resolve()) for p in used
            ):
                found.append(row["id"])
        return found

