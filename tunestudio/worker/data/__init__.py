"""A job's dataset, from where the user keeps it to what TRL's SFTTrainer trains on.

read (sources) → slice → tell the format (formats) → convert each row → render
check (templates) → drop and count unusable rows → remove duplicates (dedupe, when
the job asks) → split off the eval rows (seeded, or the rows an earlier job held out:
held_out; the record of which rows is `PreparedData.held_out`).

Errors a user can cause name the file and the row (1-based, as an editor shows it).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

from datasets import Dataset

from tunestudio.config import JobConfig
from tunestudio.worker.data import dedupe as dedupe_mod
from tunestudio.worker.data import held_out as held_out_mod
from tunestudio.worker.data.formats import Converter, RowProblem, detect_format, resolve_format
from tunestudio.worker.data.sources import SUPPORTED_SUFFIXES, Row, read_file, read_rows
from tunestudio.worker.data.templates import (
    DEFAULT_CHAT_TEMPLATE,
    clip_example,
    ensure_chat_template,
    last_turn_as_completion,
    prompt_tokens,
    supports_assistant_mask,
    text_budget,
)
from tunestudio.worker.errors import UserError

__all__ = [
    "DEFAULT_CHAT_TEMPLATE",
    "MAX_DROPPED_FRACTION",
    "SUPPORTED_SUFFIXES",
    "PreparedData",
    "Row",
    "auto_eval_size",
    "detect_format",
    "eval_size",
    "hold_out",
    "prepare",
    "read_file",
    "slice_rows",
]

MAX_DROPPED_FRACTION = 0.30  # more unusable rows than this and the job fails: the data is wrong, not noisy
_SHOWN_PROBLEMS = 5


@dataclass
class PreparedData:
    train: Dataset
    eval: Dataset | None
    format_type: str
    notes: list[str] = field(default_factory=list)  # what the user should be told, as log lines
    warnings: list[str] = field(default_factory=list)
    dropped: int = 0
    deduplicated: int = 0  # rows removed as duplicates (JobConfig.dedupe)
    held_out: dict[str, Any] | None = None  # which rows the held-out split holds (held_out.record), when it made one
    eval_places: list[dict[str, Any]] = field(default_factory=list)  # each eval row's {file, line}, in eval's order


# --- slicing and splitting ------------------------------------------------------
def slice_rows(rows: list[Any], start: int | None, end: int | None, what: str = "the dataset") -> list[Any]:
    """Rows start..end, both inclusive; the end clamps to the last row.

    Raises UserError when the slice starts past the last row: training on "the last row" instead would
    be a job the user did not ask for.
    """
    if not rows:
        return rows
    if start is not None and start >= len(rows):
        raise UserError(f"dataset_slice_start: the slice {start}..{'end' if end is None else end} starts past the end "
                        f"of {what}, which has {len(rows)} rows (numbered 0..{len(rows) - 1})")
    first = max(start or 0, 0)
    last = len(rows) - 1 if end is None else min(max(end, first), len(rows) - 1)
    return rows[first : last + 1]


def auto_eval_size(n_rows: int) -> int:
    """5% of the rows, clamped to 16..128; 0 when the dataset has under 32 rows."""
    if n_rows < 32:
        return 0
    return min(max(math.ceil(n_rows * 0.05), 16), 128)


def eval_size(n_rows: int, fraction: float | None) -> int:
    """The rows held out of n_rows: `auto_eval_size` without a fraction; else ceil(fraction x n_rows), at least 1
    and at most n_rows - 1 (0 when there are not two rows)."""
    if fraction is None:
        return auto_eval_size(n_rows)
    if n_rows < 2:
        return 0
    return min(max(math.ceil(n_rows * fraction), 1), n_rows - 1)


def hold_out(examples: list[Any], n_eval: int, seed: int) -> tuple[list[Any], list[Any]]:
    """(the rows kept for training, the n_eval held out), in their order: deterministic from the job's seed, so
    a resumed job sees the same split (and the dataset report names the same rows)."""
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    held = set(order[:n_eval])
    return ([e for i, e in enumerate(examples) if i not in held], [e for i, e in enumerate(examples) if i in held])


# --- converting and checking rows -------------------------------------------------
def _usable(rows: list[Row], convert: Converter, cfg: JobConfig, tokenizer: Any,
            fix: Any = None, clipped: list[str] | None = None,
            sources: list[Row] | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows' TRL examples, and one line per dropped row saying where and why.

    Rows longer than max_seq_length can hold are cut as text first (their places go into `clipped`); each
    example's row goes into `sources`, in the examples' order.
    """
    examples: list[dict[str, Any]] = []
    problems: list[str] = []
    budget = text_budget(tokenizer, cfg.max_seq_length)
    for row in rows:
        try:
            if row.data is None:
                raise RowProblem(row.problem)
            example = convert(row.data)
            if fix is not None:
                example = fix(example)
            example, cut = clip_example(example, budget)
            if cut and clipped is not None:
                clipped.append(row.where())
            if tokenizer is not None:
                n_prompt = prompt_tokens(example, tokenizer)
                if n_prompt is not None and n_prompt >= cfg.max_seq_length:
                    raise RowProblem(f"has a prompt of {n_prompt} tokens, which fills max_seq_length "
                                     f"{cfg.max_seq_length} and leaves no completion token to train on")
        except RowProblem as exc:
            problems.append(f"{row.where()} {exc}")
            continue
        examples.append(example)
        if sources is not None:
            sources.append(row)
    return examples, problems


def _check_drops(what: str, total: int, problems: list[str]) -> str | None:
    """Raise when too many rows were unusable; else the warning to show, or None."""
    if not problems:
        return None
    shown = "; ".join(problems[:_SHOWN_PROBLEMS]) + (f"; and {len(problems) - _SHOWN_PROBLEMS} more"
                                                     if len(problems) > _SHOWN_PROBLEMS else "")
    share = len(problems) / total
    if len(problems) == total:
        raise UserError(f"{what}: none of the {total} rows can be used: {shown}")
    if share > MAX_DROPPED_FRACTION:
        raise UserError(f"{what}: {len(problems)} of {total} rows ({share:.0%}) cannot be used, more than the "
                        f"{MAX_DROPPED_FRACTION:.0%} allowed: {shown}")
    return f"{what}: dropped {len(problems)} of {total} rows ({share:.0%}) that cannot be used: {shown}"


def _conversational(example: dict[str, Any]) -> bool:
    return "messages" in example or isinstance(example.get("prompt"), list)


def prepare(cfg: JobConfig, tokenizer: Any = None) -> PreparedData:
    """Read, slice, convert, check and split the job's dataset.

    With a tokenizer, conversations are checked against its chat template (a
    model without one gets DEFAULT_CHAT_TEMPLATE, with a warning) and rows whose
    prompt fills max_seq_length are dropped. Raises UserError naming the file
    and row when the data cannot be trained on.
    """
    rows = read_rows(cfg)
    train_rows = slice_rows(rows.train, cfg.dataset_slice_start, cfg.dataset_slice_end, f"dataset {rows.description}")
    fmt, convert, detected = resolve_format(cfg, train_rows)
    notes = [f"dataset: {len(train_rows)} rows from {rows.description}, read as {fmt}"
             + (" (auto-detected)" if detected else "")]
    if len(train_rows) < len(rows.train):
        notes.append(f"dataset: rows {cfg.dataset_slice_start or 0}..{cfg.dataset_slice_end or len(rows.train) - 1}"
                     f" kept of {len(rows.train)} (dataset_slice_start/end, both inclusive)")
    warnings: list[str] = []

    fix = None
    sample = _first_example(train_rows, convert)
    if tokenizer is not None and sample is not None and _conversational(sample):
        note = ensure_chat_template(tokenizer)
        if note:
            warnings.append(note)
        if cfg.train_on_completions and "messages" in sample and not supports_assistant_mask(tokenizer):
            fix = last_turn_as_completion
            warnings.append("train_on_completions: the chat template has no {% generation %} markers, so only "
                            "the last assistant turn of each conversation is trained on")

    clipped: list[str] = []
    sources: list[Row] = []
    examples, problems = _usable(train_rows, convert, cfg, tokenizer, fix, clipped, sources)
    drop_warning = _check_drops(f"dataset {rows.description}", len(train_rows), problems)
    if drop_warning:
        warnings.append(drop_warning)
    dropped = len(problems)
    deduplicated = 0
    if cfg.dedupe != "off":  # before the split, so no held-out row repeats a training row it removes
        gone = dedupe_mod.find(examples, near=cfg.dedupe == "near").removed(cfg.dedupe).tolist()
        deduplicated = sum(gone)
        notes.append(dedupe_mod.describe(cfg.dedupe, deduplicated, len(examples)))
        examples = [e for e, out in zip(examples, gone, strict=True) if not out]
        sources = [r for r, out in zip(sources, gone, strict=True) if not out]

    eval_examples: list[dict[str, Any]] = []
    eval_sources: list[Row] = []
    held_record = None
    if rows.eval is not None:
        if not rows.eval:
            raise UserError(f"eval_split {cfg.eval_split!r} is empty")
        eval_examples, eval_problems = _usable(rows.eval, convert, cfg, tokenizer, fix, clipped, eval_sources)
        eval_warning = _check_drops(f"eval split {cfg.eval_split}", len(rows.eval), eval_problems)
        if eval_warning:
            warnings.append(eval_warning)
        dropped += len(eval_problems)
        if cfg.eval_steps > 0:
            notes.append(f"eval: {len(eval_examples)} rows from eval_split {cfg.eval_split!r}")
        else:
            warnings.append(f"eval_split {cfg.eval_split!r} is set but eval_steps is 0, so there is no eval")
            eval_examples = eval_sources = []
    elif cfg.eval_steps > 0 and cfg.held_out_rows:  # the rows an earlier job held out (its resume, its clone)
        previous = held_out_mod.read(cfg.held_out_rows)
        split = held_out_mod.reuse(previous, sources, cfg.held_out_rows)
        notes.append(split.note)
        if split.warning:
            warnings.append(split.warning)
        held_record = held_out_mod.record(sources, split.held, previous.get("seed", cfg.random_seed),
                                          cfg.held_out_rows)
        examples, eval_examples, sources, eval_sources = (
            [examples[i] for i in split.train], [examples[i] for i in split.held],
            [sources[i] for i in split.train], [sources[i] for i in split.held])
    elif cfg.eval_steps > 0:
        n_eval = eval_size(len(examples), cfg.eval_fraction)
        if n_eval:
            kept, held = hold_out(list(range(len(examples))), n_eval, cfg.random_seed)
            held_record = held_out_mod.record(sources, held, cfg.random_seed, None)
            examples, eval_examples, sources, eval_sources = (
                [examples[i] for i in kept], [examples[i] for i in held],
                [sources[i] for i in kept], [sources[i] for i in held])
            notes.append(f"eval: held out {n_eval} of {n_eval + len(examples)} rows for evaluation "
                         f"(seed {cfg.random_seed})")
        else:
            warnings.append(f"eval_steps is set but the dataset has only {len(examples)} rows "
                            f"({'fewer than 2' if cfg.eval_fraction else 'fewer than 32'}) and no eval_split; no eval")
    if clipped:
        where = ", ".join(clipped[:_SHOWN_PROBLEMS]) + (" and more" if len(clipped) > _SHOWN_PROBLEMS else "")
        notes.append(f"dataset: {len(clipped)} row(s) far longer than max_seq_length {cfg.max_seq_length} were cut "
                     f"as text before tokenising (training keeps their first {cfg.max_seq_length} tokens either "
                     f"way): {where}")
    return PreparedData(
        train=Dataset.from_list(examples),
        eval=Dataset.from_list(eval_examples) if eval_examples else None,
        format_type=fmt,
        notes=notes,
        warnings=warnings,
        dropped=dropped,
        deduplicated=deduplicated,
        held_out=held_record,
        eval_places=[{"file": r.source, "line": r.number} for r in eval_sources] if eval_examples else [],
    )


def _first_example(rows: list[Row], convert: Converter) -> dict[str, Any] | None:
    """The first row that converts, to see which TRL shape the dataset takes."""
    for row in rows:
        if row.data is not None:
            try:
                return convert(row.data)
            except RowProblem:
                continue
    return None
