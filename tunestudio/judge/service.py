"""Judgements of a job: run in a background thread, kept as JSON files in the data directory's `judgements/`.

A judgement is a record: `{id, job_id, against, judge, status, created_at, finished_at, prompts, summary, rows}`;
status is running, completed, failed (nothing could be judged at all: the message says why) or interrupted
(the server stopped while it ran; found so at the next start). Every row is written as it is judged, so the
page shows the rows as they come. The file is replaced atomically; the judge's key is never in it.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tunestudio.judge.core import Answerer, AskJudge, Judgement, Prompt, Row, run

__all__ = ["FOLDER", "Judgements", "UnknownJudgement"]

FOLDER = "judgements"


class UnknownJudgement(LookupError):
    pass


class Judgements:
    """answerer_for(model_id, max_tokens): an Answerer for a chat model id (`<job>`, `<job>:base`), from the face."""

    def __init__(self, folder: Path, answerer_for: Callable[[str, int], Answerer]) -> None:
        self.folder = folder
        self.answerer_for = answerer_for
        self._lock = threading.Lock()
        self._threads: dict[str, threading.Thread] = {}
        self._closing = threading.Event()
        folder.mkdir(parents=True, exist_ok=True)
        for record in self._all():  # a record left running by a server that stopped
            if record.get("status") == "running":
                record.update(status="interrupted", finished_at=record.get("finished_at") or time.time(),
                              message="the server stopped while this judgement ran; the rows judged so far are kept")
                self._write(record)

    # --- the public face -----------------------------------------------------------
    def start(self, job_id: str, model: str, against: str, prompts: Sequence[Prompt], ask: AskJudge,
              judge: dict[str, str], source: str, max_tokens: int = 256) -> dict[str, Any]:
        """Start judging `model` (the job's chat model id) against `against` on `prompts`; returns the record."""
        record = {"id": f"jdg-{secrets.token_hex(6)}", "job_id": job_id, "model": model, "against": against,
                  "judge": judge, "source": source, "status": "running", "message": "", "created_at": time.time(),
                  "finished_at": None, "prompts": len(prompts), "max_tokens": max_tokens,
                  "summary": Judgement().as_dict()["summary"], "rows": []}
        self._write(record)
        thread = threading.Thread(target=self._run, args=(record, model, against, list(prompts), ask, max_tokens),
                                  name=f"judge-{record['id']}", daemon=True)
        with self._lock:
            self._threads[record["id"]] = thread
        thread.start()
        return record

    def get(self, judgement_id: str) -> dict[str, Any]:
        path = self._path(judgement_id)
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise UnknownJudgement(judgement_id) from None

    def list(self, job_id: str | None = None) -> list[dict[str, Any]]:
        """Newest first, without their rows."""
        records = [r for r in self._all() if job_id is None or r.get("job_id") == job_id]
        records.sort(key=lambda r: r.get("created_at") or 0, reverse=True)
        return [{k: v for k, v in r.items() if k != "rows"} for r in records]

    def wait(self, judgement_id: str, timeout: float | None = None) -> dict[str, Any]:
        with self._lock:
            thread = self._threads.get(judgement_id)
        if thread is not None:
            thread.join(timeout)
        return self.get(judgement_id)

    def close(self, timeout: float = 5.0) -> None:
        """Stop between rows; a judgement still running is then recorded as interrupted."""
        self._closing.set()
        with self._lock:
            threads = list(self._threads.values())
        for thread in threads:
            thread.join(timeout)

    # --- inside ----------------------------------------------------------------------
    def _run(self, record: dict[str, Any], model: str, against: str, prompts: list[Prompt], ask: AskJudge,
             max_tokens: int) -> None:
        judgement = Judgement()

        def on_row(row: Row) -> None:
            judgement.rows.append(row)
            record.update(judgement.as_dict())
            self._write(record)

        try:
            run(prompts, self.answerer_for(model, max_tokens), self.answerer_for(against, max_tokens), ask,
                on_row=on_row, stopped=self._closing.is_set)
            summary = judgement.summary()
            if self._closing.is_set() and len(judgement.rows) < len(prompts):
                record.update(status="interrupted", message="the server stopped while this judgement ran")
            elif prompts and summary.judged == 0:
                first = next((r.error for r in judgement.rows if r.error), "")
                record.update(status="failed", message=f"no row could be judged: {first}")
            else:
                record.update(status="completed")
        except Exception as exc:  # a bug here must not leave the record running forever
            record.update(status="failed", message=f"{type(exc).__name__}: {exc}")
        record.update(judgement.as_dict(), finished_at=time.time())
        self._write(record)
        with self._lock:
            self._threads.pop(record["id"], None)

    def _path(self, judgement_id: str) -> Path:
        if not judgement_id.startswith("jdg-") or not judgement_id[4:].isalnum():
            raise UnknownJudgement(judgement_id)
        return self.folder / f"{judgement_id}.json"

    def _all(self) -> list[dict[str, Any]]:
        out = []
        for path in self.folder.glob("jdg-*.json"):
            try:
                out.append(json.loads(path.read_text(encoding="utf-8")))
            except (OSError, ValueError):
                continue
        return out

    def _write(self, record: dict[str, Any]) -> None:
        path = self._path(record["id"])
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(record, indent=1), encoding="utf-8")
        os.replace(tmp, path)
