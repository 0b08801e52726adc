"""A job's dataset, from where the user keeps it to what TRL's SFTTrainer trains on.

read (sources) → slice (split) → tell the format (formats) → convert each row → render
check (templates) → drop and count unusable rows → remove duplicates (dedupe, when
the job asks) → split off the eval rows (the eval split; or the rows an earlier job
held out: held_out; or seeded: split; the record of which rows is
`PreparedData.held_out`): `prepare`, a step a function.

Errors a user can cause name the file and the row (1-based, as an editor shows it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from datasets import Dataset

from tunestudio.config import JobConfig
from tunestudio.worker.data import dedupe as dedupe_mod
from tunestudio.worker.data import held_out as held_out_mod
from tunestudio.worker.data.chat_mask import Renderer, renderer_for
from tunestudio.worker.data.formats import Converter, RowProblem, detect_format, resolve_format
from tunestudio.worker.data.held_out import write as write_held_out
from tunestudio.worker.data.report import build, load_tokenizer
from tunestudio.worker.data.rows import Rows
from tunestudio.worker.data.sources import SUPPORTED_SUFFIXES, Row, read_file, read_head, read_rows
from tunestudio.worker.data.split import auto_eval_size, eval_size, hold_out, slice_rows
from tunestudio.worker.data.templates import (
    DEFAULT_CHAT_TEMPLATE,
    clip_example,
    ensure_chat_template,
    prompt_tokens,
    text_budget,
)
from tunestudio.worker.errors import UserError

# What the rest of the worker, and the faces' children (api/preview.py, data_report/runner.py), use of data/.
__all__ = [
    "DEFAULT_CHAT_TEMPLATE",
    "MAX_DROPPED_FRACTION",
    "SUPPORTED_SUFFIXES",
    "PreparedData",
    "Row",
    "RowProblem",
    "auto_eval_size",
    "build",
    "detect_format",
    "eval_size",
    "hold_out",
    "load_tokenizer",
    "prepare",
    "read_file",
    "read_head",
    "resolve_format",
    "slice_rows",
    "write_held_out",
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
    # the eval rows as conversations (OpenAI's form, tools beside), where `eval` holds them tokenised
    eval_examples: list[dict[str, Any]] | None = None


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
    rows, train_rows, fmt, convert, notes = _read(cfg)
    work = _Work(cfg, tokenizer, convert, notes=notes)
    work.fix = _chat_template(work, train_rows)
    examples, sources = work.usable(train_rows, f"dataset {rows.description}")
    # before the split, so no held-out row repeats a training row it removes
    examples, sources, deduplicated = _dedupe(work, examples, sources)
    split = _split_eval(work, rows, examples, sources)
    if work.clipped:
        work.notes.append(_clipped_note(work.clipped, cfg.max_seq_length))
    train, evals = split.train, split.eval
    if work.renderer is not None:  # conversations: tokenised here, with their per-turn mask (chat_mask.py)
        train, evals = _tokenised(work, split)
    return PreparedData(
        train=Dataset.from_list(train),
        eval=Dataset.from_list(evals) if evals else None,
        eval_examples=split.eval if work.renderer is not None and split.eval else None,
        format_type=fmt,
        notes=work.notes,
        warnings=work.warnings,
        dropped=work.dropped,
        deduplicated=deduplicated,
        held_out=split.held,
        eval_places=[{"file": r.source, "line": r.number} for r in split.eval_rows] if split.eval else [],
    )


# --- prepare's steps ----------------------------------------------------------------
@dataclass
class _Work:
    """What prepare's steps share: the job, how a row converts, and what the user is told, in order."""

    cfg: JobConfig
    tokenizer: Any
    convert: Converter
    fix: Any = None  # what each converted example goes through, if anything
    renderer: Renderer | None = None  # how conversations become tokens and a per-turn mask (chat_mask.py)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    clipped: list[str] = field(default_factory=list)  # where rows were cut as text, training's then eval's
    dropped: int = 0

    def usable(self, rows: list[Row], what: str) -> tuple[list[dict[str, Any]], list[Row]]:
        """The rows' examples and, in their order, the rows they came from; the unusable ones dropped and counted
        (a warning), or the job refused when there are too many."""
        sources: list[Row] = []
        examples, problems = _usable(rows, self.convert, self.cfg, self.tokenizer, self.fix, self.clipped, sources)
        warning = _check_drops(what, len(rows), problems)
        if warning:
            self.warnings.append(warning)
        self.dropped += len(problems)
        return examples, sources


@dataclass
class _Split:
    """The examples trained on and those evaluated, each with the rows they came from, in the same order."""

    train: list[dict[str, Any]]
    eval: list[dict[str, Any]]
    train_rows: list[Row]
    eval_rows: list[Row]
    held: dict[str, Any] | None = None  # which rows were held out (held_out.record), when it held some out


def _read(cfg: JobConfig) -> tuple[Rows, list[Row], str, Converter, list[str]]:
    """The job's rows, its training rows sliced, their format and converter, and the notes saying so."""
    rows = read_rows(cfg)
    train_rows = slice_rows(rows.train, cfg.dataset_slice_start, cfg.dataset_slice_end, f"dataset {rows.description}")
    fmt, convert, detected = resolve_format(cfg, train_rows)
    notes = [f"dataset: {len(train_rows)} rows from {rows.description}, read as {fmt}"
             + (" (auto-detected)" if detected else "")]
    if len(train_rows) < len(rows.train):
        notes.append(f"dataset: rows {cfg.dataset_slice_start or 0}..{cfg.dataset_slice_end or len(rows.train) - 1}"
                     f" kept of {len(rows.train)} (dataset_slice_start/end, both inclusive)")
    return rows, train_rows, fmt, convert, notes


def _chat_template(work: _Work, train_rows: list[Row]) -> Any:
    """For conversations, the tokenizer gets a chat template if it has none, and `{"messages"}` rows a renderer
    (work.renderer: tokenised with a mask per assistant turn, chat_mask.py); returns the fix each example needs,
    or None."""
    cfg, tokenizer = work.cfg, work.tokenizer
    sample = _first_example(train_rows, work.convert)
    if tokenizer is None or sample is None or not _conversational(sample):
        return None
    note = ensure_chat_template(tokenizer)
    if note:
        work.warnings.append(note)
    if "messages" in sample:
        work.renderer = renderer_for(tokenizer, cfg.reasoning, cfg.train_on_completions)
    return None


def _tokenised(work: _Work, split: _Split) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The training and eval conversations as token rows with their masks; a row the template cannot render is
    dropped and counted (or the job refused when there are too many), naming its file and row."""
    assert work.renderer is not None
    everything = split.train + split.eval
    work.notes.extend(work.renderer.check(everything))
    out: list[list[dict[str, Any]]] = []
    for examples, rows, what in ((split.train, split.train_rows, "dataset"), (split.eval, split.eval_rows, "eval")):
        tokenised, problems = work.renderer.tokenise(examples, rows)
        if examples:
            warning = _check_drops(f"{what}: rendering with the chat template", len(examples), problems)
            if warning:
                work.warnings.append(warning)
        work.dropped += len(problems)
        out.append(tokenised)
    return out[0], out[1]


def _dedupe(work: _Work, examples: list[dict[str, Any]],
            sources: list[Row]) -> tuple[list[dict[str, Any]], list[Row], int]:
    """The examples and their rows without the duplicates the job asks to remove, and how many went."""
    mode = work.cfg.dedupe
    if mode == "off":
        return examples, sources, 0
    gone = dedupe_mod.find(examples, near=mode == "near").removed(mode).tolist()
    deduplicated = sum(gone)
    work.notes.append(dedupe_mod.describe(mode, deduplicated, len(examples)))
    return ([e for e, out in zip(examples, gone, strict=True) if not out],
            [r for r, out in zip(sources, gone, strict=True) if not out], deduplicated)


def _split_eval(work: _Work, rows: Rows, examples: list[dict[str, Any]], sources: list[Row]) -> _Split:
    """The eval rows: the job's eval split, else (with eval_steps) the rows an earlier job held out (its resume,
    its clone), else rows held out by the job's seed."""
    if rows.eval is not None:
        return _eval_split(work, rows.eval, examples, sources)
    if work.cfg.eval_steps > 0 and work.cfg.held_out_rows:
        return _reused_held_out(work, examples, sources)
    if work.cfg.eval_steps > 0:
        return _seeded_hold_out(work, examples, sources)
    return _Split(examples, [], sources, [])


def _eval_split(work: _Work, eval_rows: list[Row], examples: list[dict[str, Any]], sources: list[Row]) -> _Split:
    cfg = work.cfg
    if not eval_rows:
        raise UserError(f"eval_split {cfg.eval_split!r} is empty")
    eval_examples, eval_sources = work.usable(eval_rows, f"eval split {cfg.eval_split}")
    if cfg.eval_steps > 0:
        work.notes.append(f"eval: {len(eval_examples)} rows from eval_split {cfg.eval_split!r}")
        return _Split(examples, eval_examples, sources, eval_sources)
    # converted and checked all the same: an unusable eval split is refused either way
    work.warnings.append(f"eval_split {cfg.eval_split!r} is set but eval_steps is 0, so there is no eval")
    return _Split(examples, [], sources, [])


def _reused_held_out(work: _Work, examples: list[dict[str, Any]], sources: list[Row]) -> _Split:
    cfg = work.cfg
    previous = held_out_mod.read(cfg.held_out_rows)
    split = held_out_mod.reuse(previous, sources, cfg.held_out_rows)
    work.notes.append(split.note)
    if split.warning:
        work.warnings.append(split.warning)
    record = held_out_mod.record(sources, split.held, previous.get("seed", cfg.random_seed), cfg.held_out_rows)
    return _picked(examples, sources, split.train, split.held, record)


def _seeded_hold_out(work: _Work, examples: list[dict[str, Any]], sources: list[Row]) -> _Split:
    cfg = work.cfg
    n_eval = eval_size(len(examples), cfg.eval_fraction)
    if not n_eval:
        work.warnings.append(f"eval_steps is set but the dataset has only {len(examples)} rows "
                             f"({'fewer than 2' if cfg.eval_fraction else 'fewer than 32'}) and no eval_split; no eval")
        return _Split(examples, [], sources, [])
    kept, held = hold_out(list(range(len(examples))), n_eval, cfg.random_seed)
    split = _picked(examples, sources, kept, held, held_out_mod.record(sources, held, cfg.random_seed, None))
    work.notes.append(f"eval: held out {n_eval} of {n_eval + len(split.train)} rows for evaluation "
                      f"(seed {cfg.random_seed})")
    return split


def _picked(examples: list[dict[str, Any]], sources: list[Row], train: list[int], held: list[int],
            record: dict[str, Any]) -> _Split:
    """The split by index: `train` and `held` number examples (and sources, their rows)."""
    return _Split([examples[i] for i in train], [examples[i] for i in held],
                  [sources[i] for i in train], [sources[i] for i in held], record)


def _clipped_note(clipped: list[str], max_seq_length: int) -> str:
    where = ", ".join(clipped[:_SHOWN_PROBLEMS]) + (" and more" if len(clipped) > _SHOWN_PROBLEMS else "")
    return (f"dataset: {len(clipped)} row(s) far longer than max_seq_length {max_seq_length} were cut "
            f"as text before tokenising (training keeps their first {max_seq_length} tokens either "
            f"way): {where}")


def _first_example(rows: list[Row], convert: Converter) -> dict[str, Any] | None:
    """The first row that converts, to see which TRL shape the dataset takes."""
    for row in rows:
        if row.data is not None:
            try:
                return convert(row.data)
            except RowProblem:
                continue
    return None
