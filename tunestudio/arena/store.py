"""The arena's SQLite database (`TUNESTUDIO_HOME/arena.sqlite`, owner-only): its battles, votes and endpoints.

A battle is one prompt answered by two models, shown as A and B: `answering` while they answer (one at a time),
`ready` when both answers are in (only then can it be voted on), `failed` when one could not answer (the pair is
never offered for voting), `voted` once its vote is stored. A vote is one row per battle (a second is refused by
the database itself), written in the same transaction that marks the battle voted, so nothing is stored half.
Undo deletes the newest vote and makes its battle votable again. An endpoint is an OpenAI-compatible server the
user added: its URL, model and the *name* of the environment variable holding its key; never the key. The roster is
the models battles are drawn from (the page's choice; a job trained on the votes joins it).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tunestudio.settings import private_file

SCHEMA = """
CREATE TABLE IF NOT EXISTS battles (
    id         TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    status     TEXT NOT NULL CHECK (status IN ('answering', 'ready', 'failed', 'voted')),
    messages   TEXT NOT NULL,
    prompt     TEXT NOT NULL,
    model_a    TEXT NOT NULL,
    model_b    TEXT NOT NULL,
    answer_a   TEXT,
    answer_b   TEXT,
    params     TEXT NOT NULL,
    blind      INTEGER NOT NULL,
    source     TEXT NOT NULL DEFAULT '',
    error      TEXT,
    judge      TEXT
);
CREATE INDEX IF NOT EXISTS battles_created ON battles (created_at);
CREATE TABLE IF NOT EXISTS votes (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    battle_id  TEXT NOT NULL UNIQUE REFERENCES battles(id),
    choice     TEXT NOT NULL CHECK (choice IN ('a', 'b', 'tie', 'both_bad')),
    edited     TEXT,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS roster (
    model    TEXT PRIMARY KEY,
    added_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS endpoints (
    name     TEXT PRIMARY KEY,
    url      TEXT NOT NULL,
    model    TEXT NOT NULL,
    key_env  TEXT,
    added_at REAL NOT NULL
);
"""
_JSON = ("messages", "params", "judge")


class VoteRefused(RuntimeError):
    """A vote the arena cannot store (never shown, voted already, ...): the message says why; nothing was stored."""


class UnknownBattle(LookupError):
    pass


class ArenaStore:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        private_file(self.path)  # prompts and answers: the owner's only
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(self.path, timeout=10.0, check_same_thread=False, isolation_level=None)
        self._conn.row_factory = sqlite3.Row
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA foreign_keys=ON")
        self._conn.executescript(SCHEMA)

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # --- battles -------------------------------------------------------------------------
    def add_battle(self, record: dict[str, Any]) -> None:
        values = {k: json.dumps(v) if k in _JSON and v is not None else v for k, v in record.items()}
        with self._transaction() as conn:
            conn.execute(f"INSERT INTO battles ({', '.join(values)}) VALUES ({', '.join('?' * len(values))})",
                         tuple(values.values()))

    def answered(self, battle_id: str, answer_a: str | None, answer_b: str | None, error: str | None) -> None:
        """Both answers in (ready), or one missing (failed, with why)."""
        status = "failed" if error else "ready"
        with self._transaction() as conn:
            conn.execute("UPDATE battles SET answer_a = ?, answer_b = ?, error = ?, status = ? "
                         "WHERE id = ? AND status = 'answering'", (answer_a, answer_b, error, status, battle_id))

    def interrupted(self) -> None:
        """Battles left answering by a server that stopped: failed, never offered for voting."""
        with self._transaction() as conn:
            conn.execute("UPDATE battles SET status = 'failed', error = 'the server stopped while the models "
                         "answered' WHERE status = 'answering'")

    def battle(self, battle_id: str) -> dict[str, Any]:
        with self._lock:
            row = self._conn.execute("SELECT b.*, v.choice, v.edited, v.created_at AS voted_at FROM battles b "
                                     "LEFT JOIN votes v ON v.battle_id = b.id WHERE b.id = ?",
                                     (battle_id,)).fetchone()
        if row is None:
            raise UnknownBattle(battle_id)
        return _record(row)

    def set_judge(self, battle_id: str, verdict: dict[str, Any]) -> None:
        with self._transaction() as conn:
            conn.execute("UPDATE battles SET judge = ? WHERE id = ?", (json.dumps(verdict), battle_id))

    def counts(self) -> dict[str, int]:
        with self._lock:
            rows = self._conn.execute("SELECT status, COUNT(*) FROM battles GROUP BY status").fetchall()
        return {status: n for status, n in rows}

    # --- votes ---------------------------------------------------------------------------
    def vote(self, battle_id: str, choice: str, edited: str | None) -> None:
        """Store the vote and mark the battle voted, in one transaction; VoteRefused (nothing stored) otherwise."""
        with self._transaction() as conn:
            row = conn.execute("SELECT status FROM battles WHERE id = ?", (battle_id,)).fetchone()
            if row is None:
                raise UnknownBattle(battle_id)
            status = row["status"]
            if status == "voted":
                raise VoteRefused(f"battle {battle_id} has its vote already: undo it first to vote again")
            if status != "ready":
                why = "its answers are still being written" if status == "answering" else "a model failed to answer"
                raise VoteRefused(f"battle {battle_id} was never shown for voting: {why}")
            conn.execute("INSERT INTO votes (battle_id, choice, edited, created_at) VALUES (?, ?, ?, ?)",
                         (battle_id, choice, edited, time.time()))
            conn.execute("UPDATE battles SET status = 'voted' WHERE id = ?", (battle_id,))

    def undo(self) -> str | None:
        """Delete the newest vote; its battle is votable again. The battle's id, or None when there is no vote."""
        with self._transaction() as conn:
            row = conn.execute("SELECT id, battle_id FROM votes ORDER BY id DESC LIMIT 1").fetchone()
            if row is None:
                return None
            conn.execute("DELETE FROM votes WHERE id = ?", (row["id"],))
            conn.execute("UPDATE battles SET status = 'ready' WHERE id = ?", (row["battle_id"],))
            return str(row["battle_id"])

    def votes(self, limit: int | None = None, offset: int = 0) -> list[dict[str, Any]]:
        """Voted battles, oldest first."""
        sql = ("SELECT b.*, v.id AS vote_id, v.choice, v.edited, v.created_at AS voted_at FROM votes v "
               "JOIN battles b ON b.id = v.battle_id ORDER BY v.id")
        args: tuple[Any, ...] = ()
        if limit is not None:
            sql += " LIMIT ? OFFSET ?"
            args = (limit, offset)
        with self._lock:
            rows = self._conn.execute(sql, args).fetchall()
        return [_record(r) for r in rows]

    def vote_count(self) -> int:
        with self._lock:
            return int(self._conn.execute("SELECT COUNT(*) FROM votes").fetchone()[0])

    # --- the roster: the models battles are drawn from -------------------------------------
    def roster(self) -> list[str]:
        with self._lock:
            return [r[0] for r in self._conn.execute("SELECT model FROM roster ORDER BY added_at, model")]

    def set_roster(self, models: list[str]) -> None:
        with self._transaction() as conn:
            conn.execute("DELETE FROM roster")
            now = time.time()
            conn.executemany("INSERT INTO roster (model, added_at) VALUES (?, ?)",
                             [(m, now + i * 1e-6) for i, m in enumerate(models)])

    def join(self, model: str) -> None:
        with self._transaction() as conn:
            conn.execute("INSERT OR IGNORE INTO roster (model, added_at) VALUES (?, ?)", (model, time.time()))

    # --- endpoints -----------------------------------------------------------------------
    def add_endpoint(self, name: str, url: str, model: str, key_env: str | None) -> None:
        with self._transaction() as conn:
            conn.execute("INSERT OR REPLACE INTO endpoints (name, url, model, key_env, added_at) "
                         "VALUES (?, ?, ?, ?, ?)", (name, url, model, key_env, time.time()))

    def remove_endpoint(self, name: str) -> bool:
        with self._transaction() as conn:
            return conn.execute("DELETE FROM endpoints WHERE name = ?", (name,)).rowcount == 1

    def endpoints(self) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._conn.execute("SELECT * FROM endpoints ORDER BY name").fetchall()
        return [dict(r) for r in rows]


def _record(row: sqlite3.Row) -> dict[str, Any]:
    record = dict(row)
    for name in _JSON:
        if record.get(name) is not None:
            record[name] = json.loads(record[name])
    record["blind"] = bool(record["blind"])
    return record
