"""The dataset preview: the first rows of a local dataset as the job's format will read them.

The reading and format detection are the worker's own (`tunestudio.worker.data`),
so the preview can never disagree with training. That package imports
`datasets`, which the server must never load (the one rule), so the preview runs
in a short-lived child and sends its answer back as JSON: a fork of the warm worker
forkserver (`jobs.warm_context`: milliseconds) where there is one, else a spawned
interpreter (about 2 s of CPU importing).

Bounded, because any page may ask for it: at most MAX_CHILDREN children at once
(a caller waits up to SLOT_WAIT_S for one, then gets PreviewBusy), each file
read once and only its first READ_BYTES (of a Parquet file: about READ_BYTES of
decoded rows, judged from its metadata before anything is decoded), the rows
read checked as training reads them (the first SHOWN_PROBLEMS it would drop are
named), and every
cell of the answer cut to CELL_CHARS characters (lists to CELL_ITEMS items).

The route waits for its turn with `preview_rows_async`: a waiting preview holds
no thread (the server's thread pool serves every other route), at most
MAX_WAITING wait, and one more is PreviewBusy at once.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import threading
import weakref
from multiprocessing.connection import Connection
from typing import Any

PREVIEW_TIMEOUT_S = 120.0
MAX_CHILDREN = 2
SLOT_WAIT_S = 30.0
MAX_WAITING = 8  # previews waiting for a slot (holding no thread); one more is PreviewBusy at once
READ_BYTES = 1_000_000  # of each file
DETECT_ROWS = 50  # rows read to tell the format, of which the first `rows` are shown
CELL_CHARS = 2_000
CHECK_ROWS = 20_000  # rows read that are also converted, to name those training would drop
SHOWN_PROBLEMS = 10
CELL_ITEMS = 50
_slots = threading.BoundedSemaphore(MAX_CHILDREN)  # the children, whichever thread or loop asks


class PreviewTimeout(Exception):
    """The child did not answer in time (it has been killed)."""


class PreviewBusy(Exception):
    """MAX_CHILDREN previews are running and none finished within SLOT_WAIT_S."""


def preview_rows(public_config: dict[str, Any], rows: int) -> dict[str, Any]:
    """Run the preview in a spawned child; the answer is the dict `_preview` builds.

    Raises PreviewBusy when every preview slot stays taken, PreviewTimeout when the
    child takes longer than PREVIEW_TIMEOUT_S.
    """
    if not _slots.acquire(timeout=SLOT_WAIT_S):
        raise PreviewBusy(f"{MAX_CHILDREN} dataset previews are already running; try again in a moment")
    try:
        return _run_child(public_config, rows)
    finally:
        _slots.release()


class _Turns:
    """One event loop's queue for the slots: MAX_CHILDREN go, at most MAX_WAITING wait (asyncio, no thread)."""

    def __init__(self) -> None:
        self.gate = asyncio.Semaphore(MAX_CHILDREN)
        self.waiting = 0


_turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Turns] = weakref.WeakKeyDictionary()


async def preview_rows_async(public_config: dict[str, Any], rows: int) -> dict[str, Any]:
    """preview_rows for an async route: its turn is awaited on the event loop, and only a preview whose turn
    has come takes a thread (to run its child). Raises PreviewBusy at once when MAX_WAITING already wait, or
    when no turn comes within SLOT_WAIT_S; PreviewTimeout as preview_rows does."""
    from starlette.concurrency import run_in_threadpool

    turns = _turns.setdefault(asyncio.get_running_loop(), _Turns())
    if turns.gate.locked() and turns.waiting >= MAX_WAITING:
        raise PreviewBusy(f"{MAX_CHILDREN} dataset previews are running and {MAX_WAITING} more are waiting; "
                          "try again in a moment")
    turns.waiting += 1
    try:
        async with asyncio.timeout(SLOT_WAIT_S):
            await turns.gate.acquire()
    except TimeoutError:
        raise PreviewBusy(f"{MAX_CHILDREN} dataset previews are already running; try again in a moment") from None
    finally:
        turns.waiting -= 1
    try:
        return await run_in_threadpool(preview_rows, public_config, rows)
    finally:
        turns.gate.release()


def clip(value: Any, chars: int = CELL_CHARS, items: int = CELL_ITEMS) -> Any:
    """A JSON value with long strings and lists cut, saying how much was cut."""
    if isinstance(value, str):
        return value if len(value) <= chars else f"{value[:chars]}… ({len(value) - chars:,} more characters)"
    if isinstance(value, list):
        head = [clip(v, chars, items) for v in value[:items]]
        return head + ([f"… ({len(value) - items:,} more items)"] if len(value) > items else [])
    if isinstance(value, dict):
        kept = list(value.items())[:items]
        out = {str(k)[:chars]: clip(v, chars, items) for k, v in kept}
        if len(value) > items:
            out["…"] = f"{len(value) - items:,} more fields"
        return out
    return value


def _run_child(public_config: dict[str, Any], rows: int) -> dict[str, Any]:
    from tunestudio.jobs import warm_context

    ctx = warm_context() or mp.get_context("spawn")  # a fork of the warm forkserver, else a fresh interpreter
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, public_config, rows), daemon=True)
    proc.start()
    send.close()
    try:
        if not receive.poll(PREVIEW_TIMEOUT_S):
            raise PreviewTimeout(f"the preview took longer than {PREVIEW_TIMEOUT_S:.0f}s")
        try:
            return json.loads(receive.recv_bytes())
        except EOFError:
            return {"error": f"the preview process died (exit code {proc.exitcode})"}
    finally:
        receive.close()
        if proc.is_alive():
            proc.kill()
        proc.join(5)


def _child(send: Connection, public_config: dict[str, Any], rows: int) -> None:
    try:
        answer = _preview(public_config, rows)
    except Exception as exc:  # an answer the page can show beats a dead child
        answer = {"error": f"{type(exc).__name__}: {exc}"}
    send.send_bytes(json.dumps(answer, default=str).encode())
    send.close()


def _preview(public_config: dict[str, Any], rows: int) -> dict[str, Any]:
    from tunestudio.config import DataSpec
    from tunestudio.worker.data import RowProblem, read_head, resolve_format
    from tunestudio.worker.errors import UserError

    cfg = DataSpec.model_validate(public_config)  # what the route checked: files, split, method, format
    try:
        found, description, total = read_head(cfg.local_datasets, cfg.train_split, max(rows, DETECT_ROWS),
                                              READ_BYTES)
        fmt, convert, detected = resolve_format(cfg, found[:DETECT_ROWS])
    except UserError as exc:
        return {"error": str(exc)}
    shown = []
    for row in found[:rows]:
        item: dict[str, Any] = {"source": row.source, "number": row.number, "raw": clip(row.data),
                                "converted": None, "problem": row.problem}
        if row.data is not None:
            try:
                item["converted"] = clip(convert(row.data))
            except RowProblem as exc:
                item["problem"] = clip(str(exc))
        shown.append(item)
    # Every row read, not only those shown: a row training would drop is named here, before the job starts.
    problems = []
    for row in found[:CHECK_ROWS]:
        problem = row.problem
        if problem is None and row.data is not None:
            try:
                convert(row.data)
            except RowProblem as exc:
                problem = str(exc)
        if problem is not None:
            problems.append({"source": row.source, "number": row.number, "problem": clip(problem)})
    # partial: only the files' start was read, so total_rows counts the rows read, not all of them.
    return {"format": fmt, "detected": detected, "description": description,
            "total_rows": len(found) if total is None else total, "partial": total is None, "rows": shown,
            "checked_rows": min(len(found), CHECK_ROWS), "problem_count": len(problems),
            "problems": problems[:SHOWN_PROBLEMS]}
