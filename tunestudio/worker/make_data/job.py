"""One data-making run inside the worker process (kind "make_data"), top to bottom.

validate → read the sources (documents into chunks, or seed prompts) → open the output (its rows' keys: what a
resume skips) → ask the teacher, `concurrency` requests in flight, one row each, until `rows` rows are kept, the
budget (`max_requests`) is spent, the sources are used up, or a stop → each reply parsed and gated in this thread,
a kept row appended at once → the report beside the output.

The teacher is called through tunestudio/openai_client.py (a deadline per call, retries on 429 with its
Retry-After and on 5xx, a refused key named). A refused key fails the run at once; other failed calls are counted
and the run goes on, unless FAILURES_IN_A_ROW fail one after another (the teacher is down): then it fails. In
every case the rows made so far stay in the file. A stop or cancel cuts the calls in flight (their rows are
asked again by the next run).
"""

from __future__ import annotations

import os
import random
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from tunestudio.config import format_validation_error
from tunestudio.make_data_config import MakeDataConfig
from tunestudio.openai_client import Cancelled, ClientError, KeyRefused, OpenAIClient
from tunestudio.worker.channel import Channel
from tunestudio.worker.errors import UserError
from tunestudio.worker.make_data.documents import (
    DOCUMENT_SUFFIXES,
    PROMPT_SUFFIXES,
    Chunk,
    Prompt,
    chunk_sections,
    files_of,
    read_document,
    read_prompts,
)
from tunestudio.worker.make_data.gates import Gatekeeper
from tunestudio.worker.make_data.output import Output
from tunestudio.worker.make_data.teacher import Unparsed, messages_of, request_for

__all__ = ["FAILURES_IN_A_ROW", "preview", "run"]

FAILURES_IN_A_ROW = 8  # failed calls one after another that end the run: the teacher is down
MAX_VARIANTS = 50  # questions asked of one chunk at most (rows beyond chunks x this are not made)
EXAMPLES = 3  # rejected rows kept per gate for the report
PROGRESS_S = 0.5  # progress events at most this often
WAIT_S = 0.2  # how often the loop looks at a stop


@dataclass(frozen=True)
class Item:
    source: Chunk | Prompt
    variant: int

    @property
    def key(self) -> str:
        return f"{self.source.key}/{self.variant}"


@dataclass
class Tally:
    existing: int = 0
    kept: int = 0
    requests: int = 0
    failed: int = 0
    in_a_row: int = 0
    tokens: int | None = None
    removed: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)

    def reject(self, gate: str, item: Item, why: str, text: str) -> None:
        self.removed[gate] = self.removed.get(gate, 0) + 1
        shown = self.examples.setdefault(gate, [])
        if len(shown) < EXAMPLES:
            shown.append({"key": item.key, "why": why, "text": text[:500]})


def run(config: MakeDataConfig | dict[str, Any], channel: Channel, secrets: dict[str, str] | None = None,
        cache_dir: str | None = None) -> int:
    """Make the recipe's rows; the process exit code (0 completed or stopped, 1 failed). cache_dir: unused."""
    try:
        cfg = config if isinstance(config, MakeDataConfig) else MakeDataConfig.from_parts(config, secrets)
    except ValidationError as exc:
        fields = "; ".join(f"{e['field']}: {e['message']}" for e in format_validation_error(exc))
        channel.failed(f"invalid recipe: {fields}")
        return 1
    try:
        return _make(cfg, channel)
    except UserError as exc:
        channel.failed(str(exc), traceback.format_exc())
    except Exception as exc:
        channel.failed(f"{type(exc).__name__}: {exc}", traceback.format_exc())
    return 1


def _make(cfg: MakeDataConfig, channel: Channel) -> int:
    channel.phase("loading_dataset", "reading the sources")
    items = _items(cfg, channel)
    output = Output(cfg)
    if output.torn:
        channel.warn(f"{output.path}: a last row cut short ({output.torn} bytes, a run killed while writing it) was "
                     "removed; it is made again")
    gates = Gatekeeper(cfg.gates)
    for row in output.rows:
        gates.keep(row.get("messages", []))
    tally = Tally(existing=len(output.keys - {None}))
    channel.log(f"{cfg.task}: {tally.existing} rows in {output.path} already; making up to {cfg.rows}; teacher "
                f"{cfg.teacher.model} at {cfg.teacher.base_url}; budget {cfg.budget} requests")
    channel.phase("training", "asking the teacher")
    cancel = threading.Event()
    try:
        last = _loop(cfg, items, gates, tally, output.keys, cancel, channel, output.append)
    finally:
        output.close()
    stopped = channel.stop_request is not None
    channel.phase("saving", "writing the report")
    if not stopped and tally.existing + tally.kept < cfg.rows:
        why = "the budget of max_requests is spent" if tally.requests >= cfg.budget else "the sources are used up"
        channel.warn(f"{why}: {tally.existing + tally.kept} of {cfg.rows} rows made")
    report = output.report(_report(cfg, tally, stopped))
    channel.log(f"report: {report}")
    _progress(channel, cfg, tally, force=True, last=last)
    channel.completed(output_dir=cfg.output_dir, stopped=stopped, saved=True, metrics=_metrics(tally))
    return 0


def _items(cfg: MakeDataConfig, channel: Channel) -> Iterator[Item]:
    """What to ask, in order: every chunk (seeded order) once, then again for other questions; or each prompt."""
    if cfg.task == "answer":
        prompts = [p for path in files_of(cfg.sources, PROMPT_SUFFIXES) for p in read_prompts(path)]
        channel.log(f"{len(prompts)} prompts")
        return (Item(p, 0) for p in prompts)
    chunks: list[Chunk] = []
    files = files_of(cfg.sources, DOCUMENT_SUFFIXES)
    for done, path in enumerate(files):
        channel.phase("loading_dataset", f"reading {path.name}", done=done, total=len(files))
        chunks += chunk_sections(read_document(path), cfg.chunk_size, cfg.chunk_overlap)
    random.Random(cfg.seed).shuffle(chunks)
    channel.log(f"{len(files)} documents, {len(chunks)} chunks of {cfg.chunk_size} characters at most")
    return (Item(c, v) for v in range(MAX_VARIANTS) for c in chunks)


def _client(cfg: MakeDataConfig) -> OpenAIClient:
    key = cfg.api_key.get_secret_value() if cfg.api_key is not None else None
    if key is None and cfg.teacher.api_key_env:
        key = os.environ.get(cfg.teacher.api_key_env)
    return OpenAIClient(cfg.teacher.base_url, key, deadline_s=cfg.timeout, retries=cfg.retries, name="the teacher")


def _ask(client: OpenAIClient, cfg: MakeDataConfig, item: Item, cancel: threading.Event) -> tuple[str, int | None]:
    body = {"model": cfg.teacher.model, "messages": request_for(cfg.task, item.source, item.variant, cfg.turns),
            "temperature": cfg.teacher.temperature, "max_tokens": cfg.teacher.max_tokens,
            "seed": cfg.seed + item.variant}
    reply = client.post("chat/completions", body, cancel)
    try:
        content = reply["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise Unparsed("the reply is not an OpenAI chat completion") from None
    usage = reply.get("usage") if isinstance(reply, dict) else None
    tokens = usage.get("total_tokens") if isinstance(usage, dict) else None
    return str(content or ""), tokens if isinstance(tokens, int) else None


Sink = Callable[[dict[str, Any]], None]


def _loop(cfg: MakeDataConfig, items: Iterator[Item], gates: Gatekeeper, tally: Tally, skip: set[Any],
          cancel: threading.Event, channel: Channel | None, sink: Sink, target: int | None = None) -> float:
    """Ask, gate and keep until the target, the budget, the items or a stop; the time of the last progress."""
    client, want = _client(cfg), cfg.rows if target is None else target
    pending: dict[Future[tuple[str, int | None]], Item] = {}
    last = 0.0
    with ThreadPoolExecutor(cfg.concurrency, thread_name_prefix="teacher") as pool:
        try:
            exhausted = False
            while True:
                if channel is not None and channel.stop_request is not None:
                    cancel.set()
                    break
                while (not exhausted and len(pending) < cfg.concurrency and tally.requests < cfg.budget
                       and tally.existing + tally.kept + len(pending) < want):
                    item = next(items, None)
                    if item is None:
                        exhausted = True
                    elif item.key not in skip:
                        tally.requests += 1
                        pending[pool.submit(_ask, client, cfg, item, cancel)] = item
                if not pending:
                    break
                done, _ = wait(pending, timeout=WAIT_S, return_when=FIRST_COMPLETED)
                for future in done:
                    _take(cfg, pending.pop(future), future, gates, tally, sink)
                if channel is not None:
                    last = _progress(channel, cfg, tally, last=last)
        finally:
            cancel.set()  # calls still in flight end now (a stop, a failure): their rows are asked again next run
    return last


def _take(cfg: MakeDataConfig, item: Item, future: Future[tuple[str, int | None]], gates: Gatekeeper, tally: Tally,
          sink: Sink) -> None:
    """One finished call: a failure counted (KeyRefused, or too many in a row: UserError), or its row gated and
    either kept (handed to the sink) or counted against its gate."""
    try:
        reply, tokens = future.result()
    except Cancelled:
        return
    except KeyRefused as exc:
        raise UserError(f"{exc}; set the key in {cfg.teacher.api_key_env or 'teacher.api_key_env'}") from None
    except Unparsed as exc:  # not a chat completion at all
        tally.reject("parse", item, str(exc), "")
        return
    except ClientError as exc:
        tally.failed += 1
        tally.in_a_row += 1
        if tally.in_a_row >= FAILURES_IN_A_ROW:
            raise UserError(f"the teacher failed {tally.in_a_row} requests in a row; the last: {exc}") from None
        return
    tally.in_a_row = 0
    if tokens is not None:
        tally.tokens = (tally.tokens or 0) + tokens
    try:
        messages = messages_of(cfg.task, item.source, reply)
    except Unparsed as exc:
        tally.reject("parse", item, str(exc), reply)
        return
    verdict = gates.verdict(messages)
    if verdict is not None:
        tally.reject(verdict[0], item, verdict[1], "\n".join(m["content"] for m in messages))
        return
    gates.keep(messages)
    tally.kept += 1
    provenance = {**_where(item.source), "key": item.key, "variant": item.variant, "task": cfg.task}
    sink({"messages": messages, "provenance": provenance})


def _where(source: Chunk | Prompt) -> dict[str, Any]:
    if isinstance(source, Chunk):
        return source.provenance()
    return {"file": source.file, "line": source.line}


def _progress(channel: Channel, cfg: MakeDataConfig, tally: Tally, last: float, force: bool = False) -> float:
    now = time.monotonic()
    if not force and now - last < PROGRESS_S:
        return last
    elapsed = now - tally.started
    made = tally.existing + tally.kept
    eta = elapsed / tally.kept * max(cfg.rows - made, 0) if tally.kept else None
    channel.progress(step=made, total_steps=cfg.rows, num_tokens=tally.tokens, elapsed_seconds=elapsed,
                     eta_seconds=eta, extra=_metrics(tally))
    return now


def _metrics(tally: Tally) -> dict[str, float]:
    minutes = max(time.monotonic() - tally.started, 1e-9) / 60
    return {"rows_made": float(tally.kept), "rows_existing": float(tally.existing),
            "rows_rejected": float(sum(tally.removed.values())), "requests": float(tally.requests),
            "requests_failed": float(tally.failed), "requests_per_minute": tally.requests / minutes,
            **{f"removed/{gate}": float(n) for gate, n in sorted(tally.removed.items())}}


def _report(cfg: MakeDataConfig, tally: Tally, stopped: bool) -> dict[str, Any]:
    return {"output": cfg.output, "task": cfg.task, "rows_asked": cfg.rows, "rows_existing": tally.existing,
            "rows_made": tally.kept, "stopped": stopped, "requests": tally.requests, "requests_failed": tally.failed,
            "budget": cfg.budget, "tokens": tally.tokens, "removed": tally.removed, "examples": tally.examples,
            "teacher": {"base_url": cfg.teacher.base_url, "model": cfg.teacher.model},
            "seconds": round(time.monotonic() - tally.started, 3)}


def preview(cfg: MakeDataConfig, rows: int | None = None) -> list[dict[str, Any]]:
    """The first rows the recipe makes (`rows`, default its preview_rows), nothing written: each with the gate
    that removed it, if one did."""
    wanted = rows or cfg.preview_rows
    silent = _Silent()
    items = _items(cfg, silent)
    tally, made = Tally(), []
    gates = Gatekeeper(cfg.gates)
    _loop(cfg.model_copy(update={"max_requests": wanted}), items, gates, tally, set(), threading.Event(), None,
          made.append, target=wanted)
    removed = [{"removed_by": gate, **example} for gate, shown in tally.examples.items() for example in shown]
    return made + removed


class _Silent(Channel):
    def _send(self, line: str) -> None:
        pass

    def close(self) -> None:
        pass
