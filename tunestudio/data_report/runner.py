"""The dataset report from the parent's side: what is asked (`ReportRequest`), and the child that answers.

The report itself is `tunestudio.worker.data.report.build`: the worker's own reading, format detection,
templating and tokenizer, so it sees the rows exactly as a job does. That code imports the ML stack, which
the parent never loads (the one rule), so it runs in a spawned child and sends its answer back as JSON.
`tunestudio data inspect` (the CLI) and `POST /api/datasets/report` (the API) both come through here and
answer the same object.

Bounded: the child is killed past REPORT_TIMEOUT_S seconds, or as soon as its resident memory (with any
children of its own) passes REPORT_MAX_RSS bytes, checked every WATCH_S. Through the API at most
MAX_CHILDREN reports run at once and MAX_WAITING wait for their turn on the event loop (holding no
thread); one more, or a wait longer than SLOT_WAIT_S, is ReportBusy.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing as mp
import time
import weakref
from multiprocessing.connection import Connection
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tunestudio.config import FormatType, JobConfig, MappingTarget, Method

REPORT_TIMEOUT_S = 300.0
REPORT_MAX_RSS = 4 << 30
WATCH_S = 0.1
MAX_CHILDREN = 1
MAX_WAITING = 4
SLOT_WAIT_S = 30.0
NO_MODEL = "none"  # the JobConfig's model_name when no model is given: no tokenizer is loaded


class ReportRequest(BaseModel):
    """What to report on. Unset fields take JobConfig's defaults; the data fields mean what they mean there."""

    model_config = ConfigDict(extra="forbid")

    local_datasets: list[str] = Field(min_length=1, max_length=64, description="Local dataset files or folders.")
    model_name: str | None = Field(default=None, description="Tokenizer for token lengths (a local folder or a "
                                                              "cached hub id); unset: no token lengths.")
    max_seq_length: int | None = Field(default=None, ge=8, le=1_048_576)
    method: Method | None = None
    format_type: FormatType | None = None
    custom_format_mapping: dict[str, MappingTarget] | None = None
    reward_functions: list[str] | None = Field(default=None, max_length=16)
    train_split: str | None = None
    eval_split: str | None = Field(default=None, description="An eval file (path) or split name, as JobConfig's.")
    held_out: bool = Field(default=False, description="Without eval_split: the rows a job with eval_steps > 0 "
                                                      "holds out (seeded by random_seed).")
    random_seed: int | None = Field(default=None, ge=0, le=2**32 - 1)
    eval_fraction: float | None = Field(default=None, gt=0, lt=1, description="With held_out: the share held out, "
                                                                              "as JobConfig's.")
    held_out_rows: str | None = Field(default=None, description="With held_out: a job's held_out.json, whose rows "
                                                                "are held out (as JobConfig's).")
    dataset_slice_start: int | None = Field(default=None, ge=0)
    dataset_slice_end: int | None = Field(default=None, ge=0)
    train_on_completions: bool | None = None
    dedupe: Literal["off", "exact", "near"] = Field(
        default="off", description="The job's dedupe: which duplicates it removes before the held-out split.")

    def job_config(self) -> JobConfig:
        """The job config the report reads as (raises pydantic's ValidationError, as a job's would)."""
        fields = self.model_dump(exclude={"held_out", "dedupe", "model_name"}, exclude_none=True)
        fields["local_datasets"] = list(dict.fromkeys(self.local_datasets))
        if self.held_out and not self.eval_split:
            fields["eval_steps"] = 1  # a job that evaluates: it holds rows out
        else:
            fields.pop("eval_fraction", None)  # no held-out split to size
            fields.pop("held_out_rows", None)
        if self.method == "grpo" and not self.reward_functions:
            fields["reward_functions"] = ["length_penalty"]  # a job needs one; this one asks nothing of the rows
        return JobConfig.model_validate({"model_name": self.model_name or NO_MODEL, **fields})


class ReportError(Exception):
    """The report could not be made; `code` says why (for the API's status), the message is for the user."""

    code = "dataset_error"


class ReportBusy(ReportError):
    code = "busy"


class ReportTimeout(ReportError):
    code = "timeout"


class ReportTooLarge(ReportError):
    code = "too_large"


def run_report(config: JobConfig, tokenize: bool, dedupe: str = "off", *, timeout_s: float | None = None,
               max_rss: int | None = None) -> dict[str, Any]:
    """The report on a validated, resolved config, made in a spawned child.

    Raises ReportError (the dataset cannot be read, or the child died), ReportTimeout, ReportTooLarge.
    """
    timeout_s = REPORT_TIMEOUT_S if timeout_s is None else timeout_s
    max_rss = REPORT_MAX_RSS if max_rss is None else max_rss
    ctx = mp.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, config.public_dict(), tokenize, dedupe), daemon=True)
    proc.start()
    send.close()
    started = time.monotonic()
    try:
        while not receive.poll(WATCH_S):
            if not proc.is_alive() and not receive.poll(0):
                raise ReportError(f"the dataset report's process died (exit code {proc.exitcode})")
            if time.monotonic() - started > timeout_s:
                raise ReportTimeout(f"the dataset report took longer than {timeout_s:.0f}s and was stopped")
            used = _rss(proc.pid)
            if used > max_rss:
                raise ReportTooLarge(f"the dataset report needed more than {max_rss / 2**30:.1f} GiB of memory "
                                     f"({used / 2**30:.1f} GiB when it was stopped); report on fewer rows "
                                     "(dataset_slice_start/end) or a part of the files")
        try:
            answer = json.loads(receive.recv_bytes())
        except EOFError:
            raise ReportError(f"the dataset report's process died (exit code {proc.exitcode})") from None
    finally:
        receive.close()
        if proc.is_alive():
            proc.kill()
        proc.join(5)
    if "error" in answer:
        raise ReportError(answer["error"])
    return answer["report"]


def _rss(pid: int) -> int:
    """Resident bytes of a process and its children (0 once it is gone)."""
    import psutil

    try:
        root = psutil.Process(pid)
        total = root.memory_info().rss
        for child in root.children(recursive=True):
            with contextlib.suppress(psutil.Error):  # gone meanwhile
                total += child.memory_info().rss
        return total
    except psutil.Error:
        return 0


def _child(send: Connection, public_config: dict[str, Any], tokenize: bool, dedupe: str) -> None:
    try:
        answer = {"report": _report(public_config, tokenize, dedupe)}
    except Exception as exc:  # an answer the user can read beats a dead child
        from tunestudio.worker.errors import UserError

        answer = {"error": str(exc) if isinstance(exc, UserError) else f"{type(exc).__name__}: {exc}"}
    send.send_bytes(json.dumps(answer, default=str).encode())
    send.close()


def _report(public_config: dict[str, Any], tokenize: bool, dedupe: Any) -> dict[str, Any]:
    import os

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")  # a child that never forks: batches on every core
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from tunestudio.worker.data.report import build, load_tokenizer

    cfg = JobConfig.from_parts(public_config)
    tokenizer = load_tokenizer(cfg) if tokenize else None
    report = build(cfg, tokenizer, dedupe)
    report["model"] = cfg.model_name if tokenize else None
    return report


# --- the API's turns ---------------------------------------------------------------------
class _Turns:
    """One event loop's queue: MAX_CHILDREN reports run, at most MAX_WAITING wait (asyncio, no thread)."""

    def __init__(self) -> None:
        self.gate = asyncio.Semaphore(MAX_CHILDREN)
        self.waiting = 0


_turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Turns] = weakref.WeakKeyDictionary()


async def run_report_async(config: JobConfig, tokenize: bool, dedupe: str = "off") -> dict[str, Any]:
    """run_report for an async route, after waiting for its turn; ReportBusy when none comes."""
    from starlette.concurrency import run_in_threadpool

    turns = _turns.setdefault(asyncio.get_running_loop(), _Turns())
    busy = (f"{MAX_CHILDREN} dataset report(s) running and {MAX_WAITING} waiting; try again when one ends"
            if turns.gate.locked() and turns.waiting >= MAX_WAITING else None)
    if busy:
        raise ReportBusy(busy)
    turns.waiting += 1
    try:
        async with asyncio.timeout(SLOT_WAIT_S):
            await turns.gate.acquire()
    except TimeoutError:
        raise ReportBusy(f"a dataset report has been running for over {SLOT_WAIT_S:.0f}s; try again when it "
                         "ends") from None
    finally:
        turns.waiting -= 1
    try:
        return await run_in_threadpool(run_report, config, tokenize, dedupe)
    finally:
        turns.gate.release()
