"""Judgements of a job: run in a background thread, kept as JSON files in the data directory's `judgements/`.

A judgement is a record: `{id, job_id, against, judge, status, created_at, finished_at, prompts, summary, rows}`;
status is running, completed, failed (nothing could be judged at all: the message says why), cancelled (`cancel`:
the calls under way are cut, the rows judged before are kept) or interrupted (the server stopped while it ran, or
found so at the next start). Every row is written as it is judged, so the page shows the rows as they come. The
file is replaced atomically; the judge's key is never in it.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunestudio.judge.core import Answerer, AskJudge, Judgement, Prompt, Row, run

__all__ = ["FOLDER", "JudgementOver", "Judgements", "UnknownJudgement"]

FOLDER = "judgements"
CANCEL_WAIT_S = 10.0  # a cancel waits this long for the judgement's thread to record it (it takes well under 1 s)

AnswererFor = Callable[[str, int, threading.Event], Answerer]  # (model id, max tokens, cancel) -> an Answerer
JudgeFor = Callable[[threading.Event], AskJudge]  # (cancel) -> the judge, its calls cut when cancel is set


class UnknownJudgement(LookupError):
    pass


class JudgementOver(RuntimeError):
    """A cancel of a judgement that has already ended; `status` says how."""

    def __init__(self, judgement_id: str, status: str) -> None:
        super().__init__(f"judgement {judgement_id} is {status}: only a running one can be cancelled")
        self.status = status


@dataclass
class _Live:
    thread: threading.Thread
    cancel: threading.Event = field(default_factory=threading.Event)
    over: bool = False  # its outcome is decided: a cancel comes too late


class Judgements:
    """answerer_for(model_id, max_tokens, cancel): an Answerer for a chat model id (`<job>`, `<job>:base`) that
    stops when cancel is set, from the face."""

    def __init__(self, folder: Path, answerer_for: AnswererFor) -> None:
        self.folder = folder
        self.answerer_for = answerer_for
        self._lock = threading.Lock()
        self._live: dict[str, _Live] = {}
        self._closing = threading.Event()
        folder.mkdir(parents=True, exist_ok=True)
        for record in self._all():  # a record left running by a server that stopped
            if record.get("status") == "running":
                record.update(status="interrupted", finished_at=record.get("finished_at") or time.time(),
                              message="the server stopped while this judgement ran; the rows judged so far are kept")
                self._write(record)

    # --- the public face -----------------------------------------------------------
    def start(self, job_id: str, model: str, against: str, prompts: Sequence[Prompt], judge_for: JudgeFor,
              judge: dict[str, str], source: str, max_tokens: int = 256) -> dict[str, Any]:
        """Start judging `model` (the job's chat model id) against `against` on `prompts`; returns the record."""
        record = {"id": f"jdg-{secrets.token_hex(6)}", "job_id": job_id, "model": model, "against": against,
                  "judge": judge, "source": source, "status": "running", "message": "", "created_at": time.time(),
                  "finished_at": None, "prompts": len(prompts), "max_tokens": max_tokens,
                  "summary": Judgement().as_dict()["summary"], "rows": []}
        self._write(record)
        live = _Live(threading.Thread(target=self._run, args=(record, model, against, list(prompts), judge_for,
                                                              max_tokens), name=f"judge-{record['id']}", daemon=True))
        with self._lock:
            self._live[record["id"]] = live
        live.thread.start()
        return record

    def cancel(self, judgement_id: str) -> dict[str, Any]:
        """End a running judgement as cancelled: the calls under way are cut, the rows judged before are kept.
        UnknownJudgement, or JudgementOver for one that has ended."""
        with self._lock:
            live = self._live.get(judgement_id)
            if live is not None and not live.over:
                live.cancel.set()
            else:
                live = None
        if live is None:
            raise JudgementOver(judgement_id, str(self.get(judgement_id).get("status")))
        live.thread.join(CANCEL_WAIT_S)
        return self.get(judgement_id)

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
            live = self._live.get(judgement_id)
        if live is not None:
            live.thread.join(timeout)
        return self.get(judgement_id)

    def close(self, timeout: float = 5.0) -> None:
        """Cut the calls under way; a judgement still running is then recorded as interrupted."""
        self._closing.set()
        with self._lock:
            lives = list(self._live.values())
            for live in lives:
                live.cancel.set()
        for live in lives:
            live.thread.join(timeout)

    # --- inside ----------------------------------------------------------------------
    def _run(self, record: dict[str, Any], model: str, against: str, prompts: list[Prompt], judge_for: JudgeFor,
             max_tokens: int) -> None:
        with self._lock:
            live = self._live[record["id"]]
        judgement, error = Judgement(), None

        def on_row(row: Row) -> None:
            judgement.rows.append(row)
            record.update(judgement.as_dict())
            self._write(record)

        try:  # a cancel (or the server closing) cuts the calls under way and ends the loop: see run()
            run(prompts, self.answerer_for(model, max_tokens, live.cancel),
                self.answerer_for(against, max_tokens, live.cancel), judge_for(live.cancel),
                on_row=on_row, stopped=live.cancel.is_set)
        except Exception as exc:  # a bug here must not leave the record running forever
            error = f"{type(exc).__name__}: {exc}"
        with self._lock:
            live.over = True
            record.update(_outcome(judgement, len(prompts), live.cancel.is_set(), self._closing.is_set(), error),
                          **judgement.as_dict(), finished_at=time.time())
            self._write(record)
            self._live.pop(record["id"], None)

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


def _outcome(judgement: Judgement, prompts: int, cancelled: bool, closing: bool, error: str | None) -> dict[str, str]:
    """How a judgement ended: its status and message."""
    done = len(judgement.rows)
    if closing and done < prompts:
        return {"status": "interrupted", "message": "the server stopped while this judgement ran"}
    if cancelled and not closing:  # closing cancels too, to cut the calls under way
        return {"status": "cancelled", "message": f"cancelled; the {done} rows judged before it are kept"}
    if error is not None:
        return {"status": "failed", "message": error}
    if prompts and judgement.summary().judged == 0:
        first = next((r.error for r in judgement.rows if r.error), "")
        return {"status": "failed", "message": f"no row could be judged: {first}"}
    return {"status": "completed", "message": ""}
