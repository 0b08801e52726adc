"""The dataset report: what a job's data holds before anything trains on it.

It reads and converts the rows with the worker's own code (`sources`, `formats`, `templates`, `dedupe`), in
the order `prepare` does: read → slice → tell the format → convert → refuse the rows training would drop →
(dedupe) → split off the eval rows. So a refused row here is a row the job drops, a duplicate here is one
`dedupe` removes, and the held-out rows are the ones the job holds out.

Token lengths are what the trainer tokenises: a conversation through the chat template (as TRL's
`apply_chat_template`), plain text with the tokenizer's special tokens and EOS appended (as TRL's SFT
does); for the preference, unpaired and prompt-only formats, the longest sequence a row makes (prompt with
chosen or rejected; prompt with completion; the prompt alone). A row is measured up to MEASURE_FACTOR times
max_seq_length tokens (at least MEASURE_MIN): a longer one is cut as text first and counted in
`clipped_rows`, so its length and lost tokens are lower bounds.

It reads what a `ReportSpec` says (the job's data fields; no model: no token lengths). Runs in a child process
(`tunestudio/data_report/runner.py` starts it and bounds its time and memory); `build` is its whole work and
returns one JSON-ready dict, the report.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from tunestudio.config import ReportSpec
from tunestudio.worker.data import dedupe as dedupe_mod
from tunestudio.worker.data import eval_size, hold_out, slice_rows
from tunestudio.worker.data import held_out as held_out_mod
from tunestudio.worker.data.formats import Converter, RowProblem, resolve_format
from tunestudio.worker.data.sources import Row, read_rows
from tunestudio.worker.data.templates import (
    clip_example,
    ensure_chat_template,
    last_turn_as_completion,
    supports_assistant_mask,
    text_budget,
)
from tunestudio.worker.errors import UserError

HISTOGRAM_BINS = 30
MEASURE_FACTOR = 4
MEASURE_MIN = 8192
LISTED_REFUSED = 100  # refused rows listed (all are counted)
LISTED_EXAMPLES = 10  # duplicate groups shown
LISTED_OVERLAP = 50  # eval rows found in the training rows, named
TEXT_CHARS = 300  # of an example's text shown
CHUNK = 512  # rows tokenised at once


@dataclass
class Seen:
    """One row as training would see it: its converted example, or why it is refused."""

    row: Row
    example: dict[str, Any] | None = None
    reason: str | None = None
    clipped: bool = False
    tokens: int | None = None  # the longest sequence it makes
    prompt: int | None = None  # tokens before its first trained token, when the row reaches max_seq_length

    def where(self) -> dict[str, Any]:
        return {"file": self.row.source, "line": self.row.number}


def build(cfg: ReportSpec, tokenizer: Any = None) -> dict[str, Any]:
    """The report on cfg's dataset; with a tokenizer, token lengths and the rows whose prompt fills
    max_seq_length (refused, as training refuses them). `cfg.dedupe` is the job's mode: it decides which rows
    are left for the held-out split. Raises UserError when the dataset cannot be read at all."""
    started = time.monotonic()
    rows = read_rows(cfg)
    train_rows = slice_rows(rows.train, cfg.dataset_slice_start, cfg.dataset_slice_end, f"dataset {rows.description}")
    fmt, convert, detected = resolve_format(cfg, train_rows)
    notes: list[str] = []
    fix = _fix(cfg, train_rows, convert, tokenizer, notes)
    measure = max(MEASURE_FACTOR * cfg.max_seq_length, MEASURE_MIN)
    budget = text_budget(tokenizer, measure)

    train = [_convert(row, convert, fix, budget) for row in train_rows]
    evals = [_convert(row, convert, fix, budget) for row in rows.eval] if rows.eval is not None else None
    if tokenizer is not None:
        _measure([s for s in train + (evals or []) if s.example is not None], tokenizer, cfg.max_seq_length)
        for seen in train + (evals or []):
            if seen.prompt is not None and seen.prompt >= cfg.max_seq_length:
                seen.reason = (f"has a prompt of {seen.prompt} tokens, which fills max_seq_length "
                               f"{cfg.max_seq_length} and leaves no completion token to train on")
    usable = [s for s in train if s.reason is None]
    eval_usable = [s for s in evals if s.reason is None] if evals is not None else None

    texts = [dedupe_mod.text_of(s.example or {}) for s in usable]
    signed = dedupe_mod.signatures(texts)
    found = dedupe_mod.find([s.example or {} for s in usable], near=True, signed=signed)
    gone = found.removed(cfg.dedupe)
    kept = [i for i in range(len(usable)) if i not in gone]

    refused = [s for s in train + (evals or []) if s.reason is not None]
    return {
        "rows": len(train_rows),
        "usable": len(usable),
        "description": rows.description,
        "format": fmt,
        "detected": detected,
        "refused_count": len(refused),
        "refused": [{**s.where(), "reason": s.reason} for s in refused[:LISTED_REFUSED]],
        "duplicates": _duplicates(usable, texts, found, cfg.dedupe),
        "lengths": _lengths(usable, cfg.max_seq_length, measure) if tokenizer is not None else None,
        "eval_overlap": _overlap(cfg, usable, kept, eval_usable, evals, signed, found),
        "columns": _columns(train_rows),
        "roles": _roles(usable),
        "notes": notes + ([] if tokenizer is not None else
                          ["no model given: token lengths need the model's tokenizer (--model)"]),
        "seconds": round(time.monotonic() - started, 3),
    }


def load_tokenizer(name: str) -> Any:
    """The model's tokenizer, found as `worker/model.py` finds it (a local folder; else the hub's cache, then
    the hub if it answers), without the modelling libraries that module imports (peft, bitsandbytes): the
    report starts in a few seconds, not fifteen. No token is passed: the environment's hub login applies."""
    from transformers import AutoTokenizer

    from tunestudio.paths import expand
    from tunestudio.worker import hub
    from tunestudio.worker.errors import UserError

    if expand(name).is_dir():
        try:
            return AutoTokenizer.from_pretrained(str(expand(name)))
        except (OSError, ValueError) as exc:
            raise UserError(f"model {name!r}: cannot load the tokenizer from this folder: {exc}") from exc
    if hub.looks_like_local_path(name):
        raise UserError(f"model {name!r} does not exist: there is no such folder")
    try:
        return AutoTokenizer.from_pretrained(name, local_files_only=True)
    except OSError:
        pass  # not in the cache: ask the hub
    hub.require_hub("model", name)
    try:
        return AutoTokenizer.from_pretrained(name)
    except OSError as exc:
        raise UserError(f"model {name!r}: cannot load the tokenizer from the hub: {exc}") from exc


# --- rows as training sees them -----------------------------------------------------
def _fix(cfg: ReportSpec, rows: list[Row], convert: Converter, tokenizer: Any, notes: list[str]) -> Any:
    """What `prepare` does to conversations before training: the default chat template, and the last turn as
    the completion when the template cannot mask assistant turns."""
    sample = next((e for r in rows if r.data is not None and (e := _try(convert, r.data)) is not None), None)
    if tokenizer is None or sample is None or not ("messages" in sample or isinstance(sample.get("prompt"), list)):
        return None
    note = ensure_chat_template(tokenizer)
    if note:
        notes.append(note)
    if cfg.train_on_completions and "messages" in sample and not supports_assistant_mask(tokenizer):
        notes.append("train_on_completions: the chat template has no {% generation %} markers, so only the last "
                     "assistant turn of each conversation is trained on (and measured)")
        return last_turn_as_completion
    return None


def _try(convert: Converter, data: dict[str, Any]) -> dict[str, Any] | None:
    try:
        return convert(data)
    except RowProblem:
        return None


def _convert(row: Row, convert: Converter, fix: Any, budget: int) -> Seen:
    if row.data is None:
        return Seen(row, reason=row.problem)
    try:
        example = convert(row.data)
        if fix is not None:
            example = fix(example)
    except RowProblem as exc:
        return Seen(row, reason=str(exc))
    example, clipped = clip_example(example, budget)
    return Seen(row, example, clipped=clipped)


# --- token lengths ---------------------------------------------------------------------
def _pieces(example: dict[str, Any], eos: str) -> tuple[list[tuple[str, Any]], tuple[str, Any] | None]:
    """(the sequences the row makes, of which the longest counts; its prompt), each as (how, what):
    "text" is tokenised as a string, "chat" and "ask" through the chat template (ask: with the generation
    prompt)."""
    prompt = example.get("prompt")
    if "messages" in example:
        messages = example["messages"]
        first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), 0)
        return [("chat", messages)], (("ask", messages[:first]) if first else None)
    if isinstance(prompt, list):
        asks = [("chat", prompt + example[k]) for k in ("completion", "chosen", "rejected")
                if isinstance(example.get(k), list)]
        return asks or [("ask", prompt)], ("ask", prompt)
    if isinstance(prompt, str):
        tails = [example[k] for k in ("completion", "chosen", "rejected") if isinstance(example.get(k), str)]
        if "completion" in example and "label" not in example:  # SFT: TRL appends EOS to the completion
            tails = [t if t.endswith(eos) else t + eos for t in tails]
        return [("text", prompt + t) for t in tails] or [("text", prompt)], ("text", prompt)
    text = example.get("text", "")
    return [("text", text if text.endswith(eos) else text + eos)], None


def _measure(seen: list[Seen], tokenizer: Any, max_seq_length: int) -> None:
    """Each row's length, tokenised in batches (a chunk of rows at a time); and the prompt's length of each
    row that reaches max_seq_length (a shorter row's prompt cannot fill it)."""
    eos = tokenizer.eos_token or ""
    planned = [(s, *_pieces(s.example or {}, eos)) for s in seen]
    for start in range(0, len(planned), CHUNK):
        part = planned[start : start + CHUNK]
        jobs: dict[str, list[Any]] = {"text": [], "chat": [], "ask": []}
        spots = []
        for _, full, _ in part:
            spots.append([(how, _put(jobs, how, what)) for how, what in full])
        counted = {how: _count(tokenizer, how, items) for how, items in jobs.items()}
        for (s, _, _), places in zip(part, spots, strict=True):
            s.tokens = max(counted[how][i] for how, i in places)
    long = [(s, prompt) for s, _, prompt in planned if prompt is not None and (s.tokens or 0) >= max_seq_length]
    for start in range(0, len(long), CHUNK):
        part = long[start : start + CHUNK]
        jobs = {"text": [], "chat": [], "ask": []}
        places = [(prompt[0], _put(jobs, *prompt)) for _, prompt in part]
        counted = {how: _count(tokenizer, how, items) for how, items in jobs.items()}
        for (s, _), (how, i) in zip(part, places, strict=True):
            s.prompt = counted[how][i]


def _put(jobs: dict[str, list[Any]], how: str, what: Any) -> int:
    jobs[how].append(what)
    return len(jobs[how]) - 1


def _count(tokenizer: Any, how: str, items: list[Any]) -> list[int]:
    if not items:
        return []
    if how == "text":
        return [len(ids) for ids in tokenizer(items)["input_ids"]]
    encoded = tokenizer.apply_chat_template(items, add_generation_prompt=how == "ask", tokenize=True,
                                            return_dict=True)
    return [len(ids) for ids in encoded["input_ids"]]


def _percentile(ordered: list[int], p: float) -> int:
    """The smallest length at or under which at least p % of the rows lie (nearest rank)."""
    return ordered[max(1, min(len(ordered), math.ceil(p / 100 * len(ordered)))) - 1]


def _lengths(usable: list[Seen], max_seq_length: int, measure: int) -> dict[str, Any]:
    lengths = [s.tokens or 0 for s in usable]
    if not lengths:
        return {"unit": "tokens", "rows": 0, "max_seq_length": max_seq_length, "histogram": {"edges": [], "counts": []},
                "cut_rows": 0, "cut_tokens": 0, "keep_95": None, "keep_99": None, "clipped_rows": 0}
    ordered = sorted(lengths)
    low, span = ordered[0], ordered[-1] - ordered[0] + 1
    width = max(1, math.ceil(span / HISTOGRAM_BINS))
    bins = math.ceil(span / width)
    counts = [0] * bins
    for n in lengths:
        counts[(n - low) // width] += 1
    over = [n - max_seq_length for n in lengths if n > max_seq_length]
    return {
        "unit": "tokens",
        "rows": len(lengths),
        "min": ordered[0],
        "median": _percentile(ordered, 50),
        "mean": round(sum(lengths) / len(lengths), 1),
        "max": ordered[-1],
        "max_seq_length": max_seq_length,
        # bin i holds the lengths edges[i] <= n < edges[i + 1]. A row is cut when n > max_seq_length (one of
        # exactly max_seq_length tokens fits), so bin i holds only lengths that are cut exactly when
        # edges[i] > max_seq_length: the faces mark those bins (cli/data.py, report.js)
        "histogram": {"edges": [low + i * width for i in range(bins + 1)], "counts": counts},
        "cut_rows": len(over),
        "cut_tokens": sum(over),
        "keep_95": _percentile(ordered, 95),
        "keep_99": _percentile(ordered, 99),
        "measured_up_to": measure,
        "clipped_rows": sum(1 for s in usable if s.clipped),
    }


# --- duplicates and overlap ------------------------------------------------------------
def _clip(text: str) -> str:
    return text if len(text) <= TEXT_CHARS else text[:TEXT_CHARS] + "…"


def _duplicates(usable: list[Seen], texts: list[str], found: dedupe_mod.Duplicates,
                mode: dedupe_mod.Mode) -> dict[str, Any]:
    groups: dict[int, list[int]] = {}
    for i, first in found.exact.items():
        groups.setdefault(first, []).append(i)
    examples: list[dict[str, Any]] = []
    for first, copies in sorted(groups.items(), key=lambda g: (-len(g[1]), g[0]))[:LISTED_EXAMPLES]:
        examples.append({"kind": "exact", "count": len(copies) + 1, "text": _clip(texts[first]),
                         "rows": [usable[i].where() for i in [first, *copies][:LISTED_EXAMPLES]]})
    for i, (first, similarity) in list(found.near.items())[:LISTED_EXAMPLES]:
        examples.append({"kind": "near", "count": 2, "similarity": round(similarity, 3), "text": _clip(texts[first]),
                         "other_text": _clip(texts[i]), "rows": [usable[first].where(), usable[i].where()]})
    return {
        "exact": len(found.exact),
        "near": len(found.near),
        "threshold": dedupe_mod.NEAR_THRESHOLD,
        "method": f"MinHash LSH (datasketch), {dedupe_mod.NUM_PERM} permutations, word "
                  f"{dedupe_mod.SHINGLE_WORDS}-grams, estimated Jaccard ≥ {dedupe_mod.NEAR_THRESHOLD}",
        "dedupe": mode,
        "removed": len(found.removed(mode)),
        "examples": examples,
    }


def _overlap(cfg: ReportSpec, usable: list[Seen], kept: list[int], eval_usable: list[Seen] | None,
             evals: list[Seen] | None, signed: list[Any], found: dedupe_mod.Duplicates) -> dict[str, Any]:
    """The eval rows that are also training rows: exactly, or near (same threshold as duplicates)."""
    if eval_usable is not None:
        source = f"eval_split {cfg.eval_split!r}"
        train_side, eval_side = kept, None
        eval_signed = dedupe_mod.signatures(dedupe_mod.text_of(s.example or {}) for s in eval_usable)
        eval_seen = eval_usable
    elif cfg.held_out and cfg.held_out_rows:  # the rows an earlier job held out, as its clone holds them out
        try:
            split = held_out_mod.reuse(held_out_mod.read(cfg.held_out_rows), [usable[i].row for i in kept],
                                       cfg.held_out_rows)
        except UserError as exc:
            return {"source": None, "eval_rows": 0, "exact": 0, "near": 0, "rows": [], "note": str(exc)}
        source = (f"held-out rows of {cfg.held_out_rows}: {len(split.held)} of {len(kept)} rows (as the job holds "
                  "them out)")
        train_side, eval_side = [kept[i] for i in split.train], [kept[i] for i in split.held]
        eval_signed = [signed[i] for i in eval_side]
        eval_seen = [usable[i] for i in eval_side]
    elif cfg.held_out and (n_eval := eval_size(len(kept), cfg.eval_fraction)):
        source = f"held-out split: {n_eval} of {len(kept)} rows, seed {cfg.random_seed} (as the job holds them out)"
        train_side, eval_side = hold_out(kept, n_eval, cfg.random_seed)
        eval_signed = [signed[i] for i in eval_side]
        eval_seen = [usable[i] for i in eval_side]
    else:
        return {"source": None, "eval_rows": 0, "exact": 0, "near": 0, "rows": [],
                "note": "no eval rows: name an eval split, or hold rows out (held_out: a job with eval_steps > 0)"}
    # An exact copy stands for its first row in the index: a train row's first copy may be an eval row.
    keys: dict[str, int] = {}
    standing: dict[int, int] = {}  # a row in the index → a training row with its content
    for i in train_side:
        keys.setdefault(found.keys[i], i)
        standing.setdefault(found.exact.get(i, i), i)
    index = found.index or dedupe_mod.NearIndex((i, signed[i]) for i in standing)
    named: list[dict[str, Any]] = []
    exact = near = 0
    for seen, signature in zip(eval_seen, eval_signed, strict=True):
        hit = keys.get(dedupe_mod.exact_key(seen.example or {}))
        kind, similarity = "exact", 1.0
        if hit is not None:
            exact += 1
        elif (match := index.match(signature, standing.__contains__)) is not None:
            near += 1
            hit, similarity, kind = standing[match[0]], match[1], "near"
        else:
            continue
        if len(named) < LISTED_OVERLAP:
            named.append({"kind": kind, "similarity": round(similarity, 3), "eval": seen.where(),
                          "train": usable[hit].where()})
    return {"source": source, "eval_rows": len(eval_seen), "exact": exact, "near": near, "rows": named,
            "eval_refused": sum(1 for s in evals or [] if s.reason is not None)}


# --- columns and roles --------------------------------------------------------------------
def _empty(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip()) or (
        isinstance(value, (list, dict)) and not value)


def _columns(rows: list[Row]) -> dict[str, dict[str, int]]:
    """Per column of the files: in how many rows it is present, and in how many of those it is empty."""
    present: Counter[str] = Counter()
    empty: Counter[str] = Counter()
    for row in rows:
        for name, value in (row.data or {}).items():
            present[name] += 1
            empty[name] += _empty(value)
    return {name: {"rows": present[name], "empty": empty[name]} for name in sorted(present)}


def _roles(usable: list[Seen]) -> dict[str, dict[str, int]]:
    """Per role of the rows' conversations as training reads them: turns, and turns with no text."""
    turns: Counter[str] = Counter()
    empty: Counter[str] = Counter()
    for seen in usable:
        for value in (seen.example or {}).values():
            if isinstance(value, list):
                for turn in value:
                    if isinstance(turn, dict) and "role" in turn:
                        turns[turn["role"]] += 1
                        empty[turn["role"]] += _empty(turn.get("content"))
    return {role: {"turns": turns[role], "empty": empty[role]} for role in sorted(turns)}
