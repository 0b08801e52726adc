"""The dataset preview: the first rows of a local dataset as the job's format will read them.

The reading and format detection are the worker's own (`tunestudio.worker.data`),
so the preview can never disagree with training. That package imports
`datasets`, which the server must never load (the one rule), so the preview runs
in a short-lived spawned child and sends its answer back as JSON.

Bounded, because any page may ask for it: at most MAX_CHILDREN children at once
(a caller waits up to SLOT_WAIT_S for one, then gets PreviewBusy), each file
read once and only its first READ_BYTES, and every cell of the answer cut to
CELL_CHARS characters (lists to CELL_ITEMS items).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import threading
from multiprocessing.connection import Connection
from typing import Any

PREVIEW_TIMEOUT_S = 120.0
MAX_CHILDREN = 2
SLOT_WAIT_S = 30.0
READ_BYTES = 1_000_000  # of each file
DETECT_ROWS = 50  # rows read to tell the format, of which the first `rows` are shown
CELL_CHARS = 2_000
CELL_ITEMS = 50
_slots = threading.BoundedSemaphore(MAX_CHILDREN)


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
    ctx = mp.get_context("spawn")
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
    from tunestudio.config import JobConfig
    from tunestudio.worker.data.formats import RowProblem, resolve_format
    from tunestudio.worker.data.sources import read_head
    from tunestudio.worker.errors import UserError

    cfg = JobConfig.from_parts(public_config)
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
    # partial: only the files' start was read, so total_rows counts the rows read, not all of them.
    return {"format": fmt, "detected": detected, "description": description,
            "total_rows": len(found) if total is None else total, "partial": total is None, "rows": shown}
