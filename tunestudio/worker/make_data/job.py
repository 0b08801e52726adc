"""One data-making run inside the worker process (kind "make_data"), top to bottom.

validate → read the sources (documents into chunks, or seed prompts) → open the output (its rows' keys, and those
of the rows a gate removed, are what a resume skips) → `concurrency` items in flight, each in a pool thread: the
teacher asked (preference: a second answer, from rejected_by or the teacher again), the reply parsed, the gates of
one row checked (lengths, tool calls against their schema, then the judge's: score, grounding, the better of two),
until `rows` rows are kept, the budget (`max_requests`: items asked) is spent, the sources are used up, or a stop →
in this thread, duplicates against the set so far; a kept row appended at once, a removed row or a failed call
appended to `<output>.rejected.jsonl` with its reason → the report beside the output.

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
from tunestudio.make_data_config import PROMPT_TASKS, Endpoint, MakeDataConfig, read_tools_file
from tunestudio.openai_client import Cancelled, ClientError, KeyRefused, OpenAIClient
from tunestudio.worker.channel import Channel
from tunestudio.worker.errors import UserError
from tunestudio.worker.make_data import judging
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
from tunestudio.worker.make_data.gates import Gatekeeper, length_verdict, text_of
from tunestudio.worker.make_data.output import Output
from tunestudio.worker.make_data.teacher import Unparsed, Unschemed, check_calls, messages_of, request_for

__all__ = ["FAILURES_IN_A_ROW", "preview", "run"]

FAILURES_IN_A_ROW = 8  # failed calls one after another that end the run: the teacher is down
MAX_VARIANTS = 50  # questions asked of one chunk at most (rows beyond chunks x this are not made)
EXAMPLES = 3  # rejected rows kept per gate for the report
ERRORS = 5  # failed calls kept per distinct error for the report
SECOND_SEED = 1_000_003  # preference without rejected_by: the second sample's seed offset
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
class Made:
    """What one item came to in its pool thread: a row (`gate` None: duplicates are checked next), or the gate
    that removed it and why; the text is the row's (or the reply's) for the report."""

    row: dict[str, Any] | None
    text: str
    gate: str | None = None
    why: str = ""
    tokens: int | None = None
    judge_calls: int = 0
    score: int | None = None  # the judge's, kept in the row's provenance


@dataclass
class Tally:
    existing: int = 0
    kept: int = 0
    requests: int = 0
    judge_calls: int = 0
    failed: int = 0
    in_a_row: int = 0
    tokens: int | None = None
    removed: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    errors: dict[str, list[str]] = field(default_factory=dict)  # a failed call's error -> the keys (ERRORS kept)
    started: float = field(default_factory=time.monotonic)

    def reject(self, gate: str, item: Item, why: str, text: str) -> None:
        self.removed[gate] = self.removed.get(gate, 0) + 1
        shown = self.examples.setdefault(gate, [])
        if len(shown) < EXAMPLES:
            shown.append({"key": item.key, "why": why, "text": text[:500]})

    def fail(self, item: Item, error: str) -> None:
        self.failed += 1
        self.in_a_row += 1
        keys = self.errors.setdefault(error[:300], [])
        if len(keys) < ERRORS:
            keys.append(item.key)


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
    work = _Work(cfg)
    output = Output(cfg)
    if output.torn:
        channel.warn(f"{output.path}: a last row cut short ({output.torn} bytes, a run killed while writing it) was "
                     "removed; it is made again")
    gates = Gatekeeper(cfg.gates)
    for row in output.rows:
        gates.keep(_turns(row))
    tally = Tally(existing=len(output.keys - {None}))
    skip = output.keys | output.rejected_keys
    channel.log(f"{cfg.task}: {tally.existing} rows in {output.path} already ({len(output.rejected_keys)} removed by "
                f"a gate before, not asked again); making up to {cfg.rows}; teacher {cfg.teacher.model} at "
                f"{cfg.teacher.base_url}; budget {cfg.budget} requests")
    channel.phase("training", "asking the teacher")
    cancel = threading.Event()
    try:
        last = _loop(cfg, work, items, gates, tally, skip, cancel, channel, output.append, output.reject)
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
    if cfg.task in PROMPT_TASKS:
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


def _turns(row: dict[str, Any]) -> list[dict[str, Any]]:
    """A row's conversation as the gates read it: its messages, or a preference row's prompt and chosen answer."""
    return row.get("messages") or [*row.get("prompt", []), *row.get("chosen", [])]


@dataclass(frozen=True)
class _Client:
    """An endpoint's client and where its key comes from (what a refused key's error names)."""

    http: OpenAIClient
    key_field: str


def _client(endpoint: Endpoint, key: Any, cfg: MakeDataConfig, name: str, field: str) -> _Client:
    secret = key.get_secret_value() if key is not None else None
    if secret is None and endpoint.api_key_env:
        secret = os.environ.get(endpoint.api_key_env)
    where = endpoint.api_key_env or f"the variable {field}.api_key_env names"
    http = OpenAIClient(endpoint.base_url, secret, deadline_s=cfg.timeout, retries=cfg.retries, name=name)
    return _Client(http, where)


class _Work:
    """One item, start to end, in a pool thread: the calls it needs and the gates of one row (no shared state but
    the clients, which are thread-safe)."""

    def __init__(self, cfg: MakeDataConfig) -> None:
        self.cfg = cfg
        endpoints = cfg.endpoints()
        self.teacher = _client(cfg.teacher, cfg.api_key, cfg, "the teacher", "teacher")
        self.judge = self.judge_endpoint = self.weaker = None
        if "judge_api_key" in endpoints:
            self.judge_endpoint = endpoints["judge_api_key"]
            # the teacher's key goes to the teacher's endpoint only, never to a judge elsewhere
            same = self.judge_endpoint.base_url == cfg.teacher.base_url
            key = cfg.judge_api_key or (cfg.api_key if same else None)
            self.judge = _client(self.judge_endpoint, key, cfg, "the judge", "gates.judge")
        if cfg.rejected_by is not None:
            self.weaker = _client(cfg.rejected_by, cfg.rejected_api_key, cfg, "rejected_by", "rejected_by")
        try:
            self.tools = read_tools_file(cfg.tools) if cfg.tools else None
        except (OSError, ValueError) as exc:
            raise UserError(f"tools: {exc}") from None

    def __call__(self, item: Item, cancel: threading.Event) -> Made:
        cfg = self.cfg
        body = {"model": cfg.teacher.model, "messages": request_for(cfg.task, item.source, item.variant, cfg.turns),
                "temperature": cfg.teacher.temperature, "max_tokens": cfg.teacher.max_tokens,
                "seed": cfg.seed + item.variant}
        if self.tools is not None:
            body |= {"tools": self.tools, "tool_choice": "auto"}
        message, tokens = _chat(self.teacher, body, cancel)
        try:
            messages = messages_of(cfg.task, item.source, message)
            if self.tools is not None:
                check_calls(messages, self.tools)
        except Unparsed as exc:
            return Made(None, message["content"], "parse", str(exc), tokens)
        except Unschemed as exc:
            return Made(None, judging.shown(messages[-1:]), "schema", str(exc), tokens)
        made = Made({"messages": messages} if self.tools is None else {"messages": messages, "tools": self.tools},
                    text_of(messages), tokens=tokens)
        if cfg.task == "preference":
            self._second(made, body, messages, cancel)
            if made.gate is not None:
                return made
        if (verdict := length_verdict(cfg.gates, _turns(made.row))) is not None:
            made.gate, made.why = verdict
            return made
        self._judged(made, item, cancel)
        return made

    def _second(self, made: Made, body: dict[str, Any], messages: list[dict[str, Any]],
                cancel: threading.Event) -> None:
        """preference: the rejected answer (rejected_by's), or the better of two samples by the judge, both orders."""
        prompt, first = messages[:-1], messages[-1]["content"]
        if self.weaker is not None:
            reply, tokens = _chat(self.weaker, {**body, "model": self.cfg.rejected_by.model}, cancel)
            second = (reply["content"] or "").strip()
            made.tokens = _sum(made.tokens, tokens)
            chosen, rejected = first, second
        else:
            reply, tokens = _chat(self.teacher, {**body, "seed": body["seed"] + SECOND_SEED}, cancel)
            second = (reply["content"] or "").strip()
            made.tokens = _sum(made.tokens, tokens)
            if second and " ".join(second.split()) != " ".join(first.split()):
                verdicts = [judging.parse_rank(self._ask_judge(judging.rank_request(prompt, a, b), made, cancel))
                            for a, b in ((first, second), (second, first))]
                if verdicts == ["1", "2"]:
                    chosen, rejected = first, second
                elif verdicts == ["2", "1"]:
                    chosen, rejected = second, first
                else:
                    made.row, made.gate = None, "judge_undecided"
                    made.why = (f"the judge's verdicts in the two orders were {verdicts[0]!r} and {verdicts[1]!r} "
                                "(a better answer must win in both)")
                    return
            else:
                chosen, rejected = first, second
        if not rejected:
            made.row, made.gate, made.why = None, "parse", "the second answer is empty"
        elif " ".join(chosen.split()) == " ".join(rejected.split()):
            made.row, made.gate, made.why = None, "same_answers", "the two answers are the same"
        else:
            made.row = {"prompt": prompt, "chosen": [{"role": "assistant", "content": chosen}],
                        "rejected": [{"role": "assistant", "content": rejected}]}
            made.text = text_of([*prompt, {"role": "assistant", "content": chosen}])

    def _judged(self, made: Made, item: Item, cancel: threading.Event) -> None:
        """The judge's gates: the score against the rubric, then grounding in the chunk."""
        judge = self.cfg.gates.judge
        if judge is None or made.row is None:
            return
        turns = _turns(made.row)
        if judge.min_score is not None:
            reply = self._ask_judge(judging.score_request(judge.rubric, turns), made, cancel)
            score = judging.parse_score(reply)
            if score is None or score < judge.min_score:
                made.gate = "judge_score"
                made.why = (f"scored {score} (min_score {judge.min_score})" if score is not None
                            else f"the judge's reply names no score from 1 to 10: {reply[:200]!r}")
                return
            made.score = score
        if judge.grounding and isinstance(item.source, Chunk):
            reply = self._ask_judge(judging.grounding_request(item.source.text, turns), made, cancel)
            supported = judging.parse_yes_no(reply)
            if supported is not True:
                made.gate = "grounding"
                made.why = ("the judge found a fact the chunk does not state" if supported is False
                            else f"the judge's reply is neither yes nor no: {reply[:200]!r}")

    def _ask_judge(self, messages: list[dict[str, str]], made: Made, cancel: threading.Event) -> str:
        assert self.judge is not None and self.judge_endpoint is not None and self.cfg.gates.judge is not None
        body = {"model": self.judge_endpoint.model, "messages": messages, "temperature": 0,
                "max_tokens": self.cfg.gates.judge.max_tokens}
        reply, tokens = _chat(self.judge, body, cancel)
        made.judge_calls += 1
        made.tokens = _sum(made.tokens, tokens)
        return str(reply["content"] or "")


def _sum(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else a + b


def _chat(client: _Client, body: dict[str, Any], cancel: threading.Event) -> tuple[dict[str, Any], int | None]:
    """The reply's message (content text, tool_calls if any) and the tokens its usage counts; a refused key ends
    the run (UserError, naming the variable)."""
    try:
        reply = client.http.post("chat/completions", body, cancel)
    except KeyRefused as exc:
        raise UserError(f"{exc}; set the key in {client.key_field}") from None
    try:
        message = reply["choices"][0]["message"]
        if not isinstance(message, dict):
            raise TypeError
    except (KeyError, IndexError, TypeError):
        raise Unparsed("the reply is not an OpenAI chat completion") from None
    usage = reply.get("usage")
    tokens = usage.get("total_tokens") if isinstance(usage, dict) else None
    return {**message, "content": str(message.get("content") or "")}, tokens if isinstance(tokens, int) else None


Sink = Callable[[dict[str, Any]], None]


def _loop(cfg: MakeDataConfig, work: _Work, items: Iterator[Item], gates: Gatekeeper, tally: Tally, skip: set[Any],
          cancel: threading.Event, channel: Channel | None, sink: Sink, rejected: Sink,
          target: int | None = None) -> float:
    """Ask, gate and keep until the target, the budget, the items or a stop; the time of the last progress."""
    want = cfg.rows if target is None else target
    pending: dict[Future[Made], Item] = {}
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
                        pending[pool.submit(work, item, cancel)] = item
                if not pending:
                    break
                done, _ = wait(pending, timeout=WAIT_S, return_when=FIRST_COMPLETED)
                for future in done:
                    _take(cfg, pending.pop(future), future, gates, tally, sink, rejected)
                if channel is not None:
                    last = _progress(channel, cfg, tally, last=last)
        finally:
            cancel.set()  # calls still in flight end now (a stop, a failure): their rows are asked again next run
    return last


def _take(cfg: MakeDataConfig, item: Item, future: Future[Made], gates: Gatekeeper, tally: Tally, sink: Sink,
          rejected: Sink) -> None:
    """One finished item: a failed call counted and recorded (KeyRefused, or too many in a row: UserError), or its
    row checked for duplicates and either kept (handed to the sink) or recorded against its gate."""
    try:
        made = future.result()
    except Cancelled:
        return
    except Unparsed as exc:  # not a chat completion at all
        made = Made(None, "", "parse", str(exc))
    except ClientError as exc:
        tally.fail(item, str(exc))
        rejected({"key": item.key, "error": str(exc)})
        if tally.in_a_row >= FAILURES_IN_A_ROW:
            raise UserError(f"the teacher failed {tally.in_a_row} requests in a row; the last: {exc}") from None
        return
    tally.in_a_row = 0
    tally.tokens = _sum(tally.tokens, made.tokens)
    tally.judge_calls += made.judge_calls
    if made.gate is None and made.row is not None:
        verdict = gates.duplicate(_turns(made.row))
        if verdict is not None:
            made.gate, made.why = verdict
    if made.gate is not None or made.row is None:
        gate = made.gate or "parse"
        tally.reject(gate, item, made.why, made.text)
        rejected({"key": item.key, "gate": gate, "why": made.why, "text": made.text[:2000]})
        return
    gates.keep(_turns(made.row))
    tally.kept += 1
    provenance = {**_where(item.source), "key": item.key, "variant": item.variant, "task": cfg.task,
                  **({"judge_score": made.score} if made.score is not None else {})}
    sink({**made.row, "provenance": provenance})


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
            "judge_calls": float(tally.judge_calls),
            **{f"removed/{gate}": float(n) for gate, n in sorted(tally.removed.items())}}


def _report(cfg: MakeDataConfig, tally: Tally, stopped: bool) -> dict[str, Any]:
    return {"output": cfg.output, "task": cfg.task, "rows_asked": cfg.rows, "rows_existing": tally.existing,
            "rows_made": tally.kept, "stopped": stopped, "requests": tally.requests, "requests_failed": tally.failed,
            "budget": cfg.budget, "judge_calls": tally.judge_calls, "tokens": tally.tokens, "removed": tally.removed,
            "examples": tally.examples, "errors": [{"error": e, "keys": k} for e, k in tally.errors.items()],
            "teacher": cfg.teacher.identity(),
            **({"judge": cfg.endpoints()["judge_api_key"].identity()} if cfg.gates.judge else {}),
            **({"rejected_by": cfg.rejected_by.identity()} if cfg.rejected_by else {}),
            "seconds": round(time.monotonic() - tally.started, 3)}


def preview(cfg: MakeDataConfig, rows: int | None = None) -> list[dict[str, Any]]:
    """The first rows the recipe makes (`rows`, default its preview_rows), nothing written: each with the gate
    that removed it, if one did."""
    wanted = rows or cfg.preview_rows
    silent = _Silent()
    items = _items(cfg, silent)
    tally, made, failed = Tally(), [], []
    gates = Gatekeeper(cfg.gates)
    _loop(cfg.model_copy(update={"max_requests": wanted}), _Work(cfg), items, gates, tally, set(), threading.Event(),
          None, made.append, lambda row: failed.append(row) if "error" in row else None, target=wanted)
    removed = [{"removed_by": gate, **example} for gate, shown in tally.examples.items() for example in shown]
    calls = [{"removed_by": "failed_call", "key": row["key"], "why": row["error"], "text": ""} for row in failed]
    return made + removed + calls


class _Silent(Channel):
    def _send(self, line: str) -> None:
        pass

    def close(self) -> None:
        pass
