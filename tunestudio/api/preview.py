"""The dataset preview: the first rows of a local dataset as the job's format will read them.

The reading and format detection are the worker's own (`tunestudio.worker.data`),
so the preview can never disagree with training. That package imports
`datasets`, which the server must never load (the one rule), so the preview runs
in a short-lived spawned child and sends its answer back as JSON.
"""

from __future__ import annotations

import json
import multiprocessing as mp
from multiprocessing.connection import Connection
from typing import Any

PREVIEW_TIMEOUT_S = 120.0


class PreviewTimeout(Exception):
    """The child did not answer in time (it has been killed)."""


def preview_rows(public_config: dict[str, Any], rows: int) -> dict[str, Any]:
    """Run the preview in a spawned child; the answer is the dict `_preview` builds.

    Raises PreviewTimeout when the child takes longer than PREVIEW_TIMEOUT_S.
    """
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
    from tunestudio.worker.data.sources import read_rows
    from tunestudio.worker.errors import UserError

    cfg = JobConfig.from_parts(public_config)
    try:
        found = read_rows(cfg)
        fmt, convert, detected = resolve_format(cfg, found.train)
    except UserError as exc:
        return {"error": str(exc)}
    shown = []
    for row in found.train[:rows]:
        item: dict[str, Any] = {"source": row.source, "number": row.number, "raw": row.data,
                                "converted": None, "problem": row.problem}
        if row.data is not None:
            try:
                item["converted"] = convert(row.data)
            except RowProblem as exc:
                item["problem"] = str(exc)
        shown.append(item)
    return {"format": fmt, "detected": detected, "description": found.description,
            "total_rows": len(found.train), "rows": shown}
