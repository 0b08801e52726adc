"""Every job's record, metrics and events, in SQLite (WAL) under the data directory.

One writer thread (writer.py) owns the only write connection and commits in
batches: whatever is queued when it wakes goes into one transaction. `flush()`
waits until everything queued before it is committed; writes that must be
durable before they are reported (a new job, a final status) pass `wait=True`.
A write the database refuses (disk full, read-only, locked) is retried, its
waiting callers get `StoreUnavailable` at once, and the rest is kept in memory
until the database takes it: reads of a job see its unwritten fields.
Readers use their own connection per thread; WAL lets them read while the
writer writes.
"""

from __future__ import annotations

import heapq
import json
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from operator import itemgetter
from pathlib import Path
from typing import Any

from tunestudio.jobs.schema import (
    ADDED_COLUMNS,
    INT64_MAX,
    JOB_COLUMNS,
    JOB_SELECT,
    JSON_COLUMNS,
    METRIC_COLUMNS,
    METRICS_TABLE,
    PROGRESS_COLUMNS,
    SCHEMA,
    progress_record,
    progress_values,
)
from tunestudio.jobs.writer import StoreUnavailable, Writer
from tunestudio.settings import private_file

log = logging.getLogger(__name__)



class DuplicateRequest(Exception):
    """A job with this client request id exists already."""

    def __init__(self, job_id: str) -> None:
        super().__init__(job_id)
        self.job_id = job_id


def _encode(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: json.dumps(v) if k in JSON_COLUMNS and v is not None else v for k, v in fields.items()}


def _evaluates(record: dict[str, Any]) -> bool:
    """A metrics record with an evaluation in it (eval_loss, or a method's eval_ metric)."""
    return record.get("eval_loss") is not None or any(key.startswith("eval_") for key in record.get("extra") or {})


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


METRIC_SQL = (
    f"INSERT INTO metrics (job_id, seq, {', '.join(PROGRESS_COLUMNS)}) "
    f"VALUES ({', '.join('?' * (len(PROGRESS_COLUMNS) + 2))})"
)


def _write_pending(conn: sqlite3.Connection, events: list, metrics: list, updates: dict) -> None:
    if events:
        conn.executemany("INSERT OR IGNORE INTO events VALUES (?, ?, ?, ?)", events)
        events.clear()
    if metrics:
        conn.executemany(METRIC_SQL, metrics)
        metrics.clear()
    for job_id, fields in updates.items():
        fields = _encode(fields)
        assignments = ", ".join(f"{k} = ?" for k in fields)
        conn.execute(f"UPDATE jobs SET {assignments} WHERE id = ?", (*fields.values(), job_id))
    updates.clear()


def _decode(row: sqlite3.Row) -> dict[str, Any]:
    out = dict(row)
    for key in JSON_COLUMNS:
        if out.get(key) is not None:
            out[key] = json.loads(out[key])
    return out


class StoreError(Exception):
    """The database cannot be opened: one line saying what, where, and what to do."""


def open_error(path: Path, exc: BaseException) -> StoreError:
    folder = path.parent
    code = getattr(exc, "sqlite_errorname", "")
    if code in ("SQLITE_NOTADB", "SQLITE_CORRUPT") or "not a database" in str(exc).lower():
        return StoreError(f"the job database {path} is not a valid SQLite database (corrupt, or another file): "
                          "move it aside to start a new one, or restore a backup; tunestudio left it untouched")
    if isinstance(exc, PermissionError) or "readonly" in str(exc).lower() or "unable to open" in str(exc).lower():
        return StoreError(f"the data directory {folder} is not writable ({exc}): make it writable, or set "
                          "TUNESTUDIO_HOME to a folder you can write")
    return StoreError(f"cannot open the job database {path}: {exc}; check the file and its folder {folder}")


class Store:
    def __init__(self, path: Path, busy_timeout: float = 1.0, retry_seconds: float = 3.0,
                 idle_retry_seconds: float = 0.5) -> None:
        """Open (or create) the database; StoreError with one clear line if it cannot be used.

        busy_timeout: how long one write waits for another process's lock; retry_seconds: how long
        a failing write is retried before its callers hear of it (see writer.py).
        """
        self.path = Path(path)
        self._local = threading.local()
        self._closed = False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Checked first: SQLite would fail later, on the first write, with a less helpful message.
            for target in (self.path.parent, self.path):
                if target.exists() and not os.access(target, os.W_OK):
                    raise PermissionError(f"{target} is read-only")
            private_file(self.path)  # every job's config, events and metrics: the owner's only (and its WAL)
            conn = self._connect(busy_timeout)
            self._create_schema(conn)
            conn.execute("SELECT COUNT(*) FROM jobs").fetchone()  # a damaged file fails here, not mid-request
        except (OSError, sqlite3.Error) as exc:
            raise open_error(self.path, exc) from None
        self._writer = Writer(conn, self._apply, self.path, retry_seconds, idle_retry_seconds)

    @staticmethod
    def _create_schema(writer: sqlite3.Connection) -> None:
        writer.executescript(SCHEMA.replace("-- metrics:", METRICS_TABLE + ";\n-- metrics:", 1))
        for table, name, sql_type in ADDED_COLUMNS:
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

    def _connect(self, busy_timeout: float = 10.0) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=busy_timeout, check_same_thread=False, isolation_level="DEFERRED")
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

    # --- the writer (see writer.py: batching, retries, what a failure keeps) ---------------------
    @staticmethod
    def _apply(conn: sqlite3.Connection, batch: list[tuple[Any, ...]]) -> None:
        """Write a batch of ops on the writer's connection, uncommitted.

        Appends and updates are gathered until a barrier (insert, delete, a stop request)
        and written as one executemany per table and one UPDATE per job.
        """
        events: list[tuple] = []
        metrics: list[tuple] = []
        updates: dict[str, dict[str, Any]] = {}
        for op in batch:
            kind = op[0]
            if kind == "append":
                _, job_id, event_rows, metric_rows, fields, _told = op
                events.extend(event_rows)
                metrics.extend(metric_rows)
                if fields:
                    updates.setdefault(job_id, {}).update(fields)
                continue
            if kind == "update":  # coalesce: the latest value of each field wins
                updates.setdefault(op[1], {}).update(op[2])
                continue
            _write_pending(conn, events, metrics, updates)
            box = op[-1]
            box.clear()  # a retried batch starts over
            if kind == "insert":
                try:
                    conn.execute(f"INSERT INTO jobs ({', '.join(op[1])}) VALUES ({', '.join('?' * len(op[1]))})",
                                 tuple(op[1].values()))
                except sqlite3.IntegrityError as exc:
                    box["error"] = exc
            elif kind == "clear_request":  # only if it is still what the reader saw
                _, job_id, wanted, _ = op
                cur = conn.execute("UPDATE jobs SET stop_request = NULL WHERE id = ? AND stop_request = ?",
                                   (job_id, wanted))
                box["taken"] = cur.rowcount == 1
            elif kind == "delete":
                for table, column in (("events", "job_id"), ("metrics", "job_id"), ("jobs", "id")):
                    conn.execute(f"DELETE FROM {table} WHERE {column} = ?", (op[1],))
        _write_pending(conn, events, metrics, updates)

    def flush(self, timeout: float = 30.0) -> None:
        """Return once everything queued before this call is committed.

        Raises StoreUnavailable (at once, not after a hang) when the database refuses the writes.
        """
        self._writer.flush(timeout)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self.flush()
            except (StoreUnavailable, TimeoutError) as exc:
                log.error("closing the store: %s", exc)
            self._writer.close()

    def add_listener(self, listener: Callable[[frozenset[str]], None]) -> None:
        """`listener(job_ids)` once a write that changes those jobs' status or adds an evaluation is committed
        (readable); see Writer.add_listener."""
        self._writer.add_listener(listener)

    def remove_listener(self, listener: Callable[[frozenset[str]], None]) -> None:
        self._writer.remove_listener(listener)

    # --- writes ----------------------------------------------------------------
    def insert_job(self, fields: dict[str, Any]) -> None:
        """Insert a job row and wait until it is committed; raises DuplicateRequest."""
        unknown = set(fields) - set(JOB_COLUMNS)
        assert not unknown, unknown
        box: dict[str, Any] = {}
        self._writer.put(("insert", _encode(fields), box))
        self.flush()  # StoreUnavailable: the job is not created, now or later
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
        self._writer.put(("update", job_id, fields))
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
        metrics = list(metrics)
        self._writer.put((
            "append",
            job_id,
            [(job_id, seq, kind, data) for seq, kind, data in events],
            [(job_id, seq, *progress_values(r)) for seq, r in metrics],
            fields,
            "status" in fields or any(_evaluates(r) for _, r in metrics),  # told to listeners
        ))

    def take_stop_request(self, job_id: str, wanted: str) -> bool:
        """Clear a job's stop request if it is still `wanted`; False if another process changed it meanwhile."""
        box: dict[str, Any] = {}
        self._writer.put(("clear_request", job_id, wanted, box))
        self.flush()
        return bool(box.get("taken"))

    def delete_job(self, job_id: str) -> None:
        box: dict[str, Any] = {}
        self._writer.put(("delete", job_id, box))
        self.flush()
        if "error" in box:
            raise box["error"]

    # --- reads -----------------------------------------------------------------
    def _row(self, row: sqlite3.Row) -> dict[str, Any]:
        """A job row as the caller should see it: with fields accepted but not yet written (a final status kept
        in memory while the database refuses writes)."""
        out = _decode(row)
        out.update(self._writer.unwritten(out["id"]))
        return out

    @property
    def failure(self) -> StoreUnavailable | None:
        """Why the database refuses writes now, or None."""
        return self._writer.failure

    def get_job(self, job_id: str) -> dict[str, Any] | None:
        row = self._reader().execute(f"{JOB_SELECT} WHERE id = ?", (job_id,)).fetchone()
        return self._row(row) if row else None

    def find_by_request_id(self, request_id: str) -> dict[str, Any] | None:
        row = self._reader().execute(f"{JOB_SELECT} WHERE request_id = ?", (request_id,)).fetchone()
        return self._row(row) if row else None

    def list_jobs(
        self, statuses: Iterable[str] | None = None, limit: int = 50, offset: int = 0, oldest_first: bool = False,
        sweep_id: str | None = None,
    ) -> list[dict[str, Any]]:
        conditions, args = [], []
        wanted = list(statuses or [])
        if wanted:
            conditions.append(f"status IN ({', '.join('?' * len(wanted))})")
            args.extend(wanted)
        if sweep_id is not None:
            conditions.append("sweep_id = ?")
            args.append(sweep_id)
        where = f"WHERE {' AND '.join(conditions)}" if conditions else ""
        order = "ASC" if oldest_first else "DESC"
        rows = self._reader().execute(
            f"{JOB_SELECT} {where} ORDER BY created_at {order}, rowid {order} LIMIT ? OFFSET ?",
            (*args, limit, offset),
        ).fetchall()
        return [self._row(r) for r in rows]

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
            (row[0], "progress", None, {"kind": "progress", **progress_record(row[1:])})
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
                out[row[0]] = progress_record(tuple(row)[1:])
        return out

    def metrics(self, job_id: str, since_step: int | None = None) -> list[dict[str, Any]]:
        sql = f"SELECT {', '.join(METRIC_COLUMNS)} FROM metrics WHERE job_id = ?"
        args: list[Any] = [job_id]
        if since_step is not None:
            sql += " AND step > ?"
            args.append(since_step)
        rows = self._reader().execute(sql + " ORDER BY step, rowid", args).fetchall()
        return [progress_record(tuple(r)) for r in rows]

    def messages(self, job_id: str, kinds: Sequence[str], upto: int | None = None,
                 limit: int = 500) -> list[tuple[int, str, str]]:
        """(seq, kind, data_json) of the job's stored events of these kinds (progress is not among them), the
        newest `limit` up to seq `upto`, oldest first."""
        rows = self._reader().execute(
            f"SELECT seq, kind, data FROM events WHERE job_id = ? AND kind IN ({', '.join('?' * len(kinds))}) "
            "AND seq <= ? ORDER BY seq DESC LIMIT ?",
            (job_id, *kinds, INT64_MAX if upto is None else upto, limit),
        ).fetchall()
        return [(row[0], row[1], row[2]) for row in reversed(rows)]

    def base_eval_loss(self, job_id: str) -> float | None:
        """The eval loss the job measured at step 0 (the base model's), if it did."""
        row = self._reader().execute(
            "SELECT eval_loss FROM metrics WHERE job_id = ? AND step = 0 AND eval_loss IS NOT NULL LIMIT 1", (job_id,)
        ).fetchone()
        return row[0] if row else None

    def output_dirs(self) -> list[dict[str, Any]]:
        """(id, status, output_dir) of every job with an output folder."""
        rows = self._reader().execute("SELECT id, status, output_dir FROM jobs WHERE output_dir IS NOT NULL")
        return [dict(r) for r in rows.fetchall()]

    def resumed_by(self, job_id: str) -> str | None:
        """The job that resumed this one, if any."""
        row = self._reader().execute("SELECT id FROM jobs WHERE resumed_from = ? LIMIT 1", (job_id,)).fetchone()
        return row[0] if row else None

    def jobs_referring_to(self, folder: str, removed: list[str], besides: str) -> list[str]:
        """Other jobs whose output folder or checkpoint is `folder`, or lies in one of the `removed` paths (what
        deleting `besides`'s artefacts takes away), or that resumed `besides`."""
        target = Path(folder).resolve()
        doomed = [Path(p).resolve() for p in removed]
        found = []
        rows = self._reader().execute("SELECT id, output_dir, resumed_from, config FROM jobs WHERE id != ?", (besides,))
        for row in rows.fetchall():
            config = json.loads(row["config"]) if row["config"] else {}
            used = [Path(p).resolve() for p in (row["output_dir"], config.get("resume_from_checkpoint"))
                    if p and p != "latest"]
            if row["resumed_from"] == besides or any(
                p == target or any(p.is_relative_to(d) for d in doomed) for p in used
            ):
                found.append(row["id"])
        return found

    def exports_of(self, job_id: str) -> list[dict[str, Any]]:
        """(id, status, output_dir) of the export jobs of a job."""
        rows = self._reader().execute(
            "SELECT id, status, output_dir FROM jobs WHERE source_job = ? ORDER BY created_at", (job_id,))
        return [dict(r) for r in rows.fetchall()]

