"""The dataset report from the parent's side: what is asked (a `ReportSpec`), and the child that answers.

The report itself is `tunestudio.worker.data.report.build` (data/'s face gives it): the worker's own reading,
format detection, templating and tokenizer, so it sees the rows exactly as a job does. That code imports the ML
stack, which the parent never loads (the one rule), so it runs in a child and sends its answer back as JSON: a fork
of the server's warm worker forkserver when it is ready (as a dataset preview's, api/preview.py: it starts in
milliseconds with the data code and the tokenizer's library imported), else a spawned interpreter (about 5 s of
CPU before the first row): the CLI's, a server whose forkserver is still importing, one with prewarm off, or one on
a machine with a GPU, where workers are always spawned (jobs/prewarm.py).
`tunestudio data inspect` (the CLI) and `POST /api/datasets/report` (the API) both come through here and
answer the same object: each validates a `ReportSpec` (config/report.py: the job's data fields, defaults and
checks), the API confines its paths (`paths.confine_inputs`), and both resolve them (`resolved`).

Bounded: the child is killed past REPORT_TIMEOUT_S seconds, or as soon as its private memory (USS, with any children
of its own: what it alone holds, so a fork's pages still shared with the forkserver do not count, those it has written
do) passes REPORT_MAX_RSS bytes, checked every WATCH_S (its USS read only once its resident memory, never less but for
hugetlb pages, has passed the bound: a read of USS takes milliseconds). The child streams the rows and keeps about 300
bytes of each (worker/data/tally.py): a million short rows take about 95 s and 0.8 GiB with a tokenizer on two cores
(bench/dataset_report.py --shape short). Through the API at most MAX_CHILDREN reports run at once and MAX_WAITING wait
for their turn on the event loop (holding no thread); one more, or a wait longer than SLOT_WAIT_S, is ReportBusy.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import sys
import time
import weakref
from multiprocessing.connection import Connection
from typing import Any

from tunestudio import paths
from tunestudio.config import ReportSpec

REPORT_TIMEOUT_S = 300.0
REPORT_MAX_RSS = 4 << 30
WATCH_S = 0.1
MAX_CHILDREN = 1
MAX_WAITING = 4
SLOT_WAIT_S = 30.0


def resolved(spec: ReportSpec) -> ReportSpec:
    """The spec with its local paths absolute, as a job's are (raises paths.PathRefused naming the field)."""
    return spec.model_copy(update=paths.resolve_inputs(spec))


class ReportError(Exception):
    """The report could not be made; `code` says why (for the API's status), the message is for the user."""

    code = "dataset_error"


class ReportBusy(ReportError):
    code = "busy"


class ReportTimeout(ReportError):
    code = "timeout"


class ReportTooLarge(ReportError):
    code = "too_large"


def run_report(spec: ReportSpec, *, timeout_s: float | None = None, max_rss: int | None = None) -> dict[str, Any]:
    """The report on a validated, resolved spec, made in a child (token lengths when it names a model): a fork of
    the warm worker forkserver, else a spawned interpreter (the module's docstring).

    Raises ReportError (the dataset cannot be read, or the child died), ReportTimeout, ReportTooLarge.
    """
    from tunestudio.jobs import warm_context

    timeout_s = REPORT_TIMEOUT_S if timeout_s is None else timeout_s
    max_rss = REPORT_MAX_RSS if max_rss is None else max_rss
    ctx = warm_context() or mp.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, spec.model_dump(mode="json")), daemon=True)
    proc.start()
    send.close()
    started = time.monotonic()
    try:
        while not receive.poll(WATCH_S):
            if not proc.is_alive() and not receive.poll(0):
                raise ReportError(f"the dataset report's process died (exit code {proc.exitcode})")
            if time.monotonic() - started > timeout_s:
                raise ReportTimeout(f"the dataset report took longer than {timeout_s:.0f}s and was stopped; report on "
                                    "fewer rows (dataset_slice_start/end) or a part of the files")
            # the private bytes only once the resident ones pass the bound: a fork's RSS counts what it shares
            if _memory(proc.pid, private=False) > max_rss and (used := _memory(proc.pid, private=True)) > max_rss:
                raise ReportTooLarge(f"the dataset report needed more than {_amount(max_rss)} of memory "
                                     f"({_amount(used)} when it was stopped); report on fewer rows "
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


def _amount(size: int) -> str:
    """Bytes as GiB with a decimal, or MiB under one GiB (a bound of 96 MiB is not "0.1 GiB")."""
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.0f} MiB"


def _memory(pid: int, private: bool) -> int:
    """Bytes a process and its children hold (0 once it is gone): `private`, their USS, the memory they alone hold
    and what they cost the machine (psutil reads /proc/PID/smaps_rollup: about 6 ms on a process holding the ML
    stack); else their RSS, never less than it (hugetlb pages aside) and read in
    microseconds."""
    import psutil

    def held(process: psutil.Process) -> int:
        return process.memory_full_info().uss if private else process.memory_info().rss

    try:
        root = psutil.Process(pid)
        total = held(root)
        for child in root.children(recursive=True):
            with contextlib.suppress(psutil.Error):  # gone meanwhile
                total += held(child)
        return total
    except psutil.Error:
        return 0


def _child(send: Connection, fields: dict[str, Any]) -> None:
    try:
        answer = {"report": _report(fields)}
    except Exception as exc:  # an answer the user can read beats a dead child
        from tunestudio.worker.errors import UserError

        answer = {"error": str(exc) if isinstance(exc, UserError) else f"{type(exc).__name__}: {exc}"}
    send.send_bytes(json.dumps(answer, default=str).encode())
    send.close()


def _report(fields: dict[str, Any]) -> dict[str, Any]:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")  # a child that never forks: batches on every core
    if "TRANSFORMERS_VERBOSITY" not in os.environ:  # the user's, else errors only
        os.environ["TRANSFORMERS_VERBOSITY"] = "error"
        if "transformers" in sys.modules:  # a fork of the forkserver, which imported it before the variable was set
            sys.modules["transformers"].logging.set_verbosity_error()
    return make_report(ReportSpec.model_validate(fields))


def make_report(spec: ReportSpec) -> dict[str, Any]:
    """The report, made in this process (the child's work; imports the worker's data code and the ML stack): a
    model's tokenizer measures text rows; rows with images are measured by its processor, loaded and set as an
    image job loads it (the image modality: a model without a vision tower is refused in the job's words), and
    recordings by its speech processor (the audio modality: its window and tokenizer)."""
    from tunestudio.worker.data import build, is_audio_data, is_image_data, load_tokenizer
    from tunestudio.worker.modalities import named

    notes: list[str] = []
    measurer = None
    if spec.model_name is not None and is_image_data(spec):
        measurer = named("image").load_processor(spec)  # type: ignore[arg-type]  # reads the fields a report has
        notes = list(getattr(measurer, "tunestudio_notes", []))
    elif spec.model_name is not None and is_audio_data(spec):
        measurer = named("audio").load_processor(spec)  # type: ignore[arg-type]  # its window, its tokenizer
        notes = list(getattr(measurer, "tunestudio_notes", []))
    elif spec.model_name is not None:
        measurer = load_tokenizer(spec.model_name)
    report = build(spec, measurer)
    report["notes"][:0] = notes
    report["model"] = spec.model_name
    return report


# --- the API's turns ---------------------------------------------------------------------
class _Turns:
    """One event loop's queue: MAX_CHILDREN reports run, at most MAX_WAITING wait (asyncio, no thread)."""

    def __init__(self) -> None:
        self.gate = asyncio.Semaphore(MAX_CHILDREN)
        self.waiting = 0


_turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Turns] = weakref.WeakKeyDictionary()


async def run_report_async(spec: ReportSpec) -> dict[str, Any]:
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
        return await run_in_threadpool(run_report, spec)
    finally:
        turns.gate.release()
