"""The steps the text pipeline (`prepare`) and the image pipeline (image_data.py) share: what a prepared dataset is
(`PreparedData`), the state a preparation carries (`Work`: the job, its notes and warnings, what was dropped), the
drop rule (`check_drops`), and the eval split (`split_eval`: the job's eval split, the rows an earlier job held out,
or rows held out by the job's seed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from datasets import Dataset

from tunestudio.config import JobConfig
from tunestudio.worker.data import held_out as held_out_mod
from tunestudio.worker.data.chat_mask import Renderer
from tunestudio.worker.data.formats import Converter, RowProblem
from tunestudio.worker.data.rows import Row, Rows
from tunestudio.worker.data.split import eval_size, hold_out
from tunestudio.worker.data.templates import clip_example, prompt_tokens, text_budget
from tunestudio.worker.errors import UserError

MAX_DROPPED_FRACTION = 0.30  # more unusable rows than this and the job fails: the data is wrong, not noisy
SHOWN_PROBLEMS = 5


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


def check_drops(what: str, total: int, problems: list[str]) -> str | None:
    """Raise when too many rows were unusable; else the warning to show, or None."""
    if not problems:
        return None
    shown = "; ".join(problems[:SHOWN_PROBLEMS]) + (f"; and {len(problems) - SHOWN_PROBLEMS} more"
                                                     if len(problems) > SHOWN_PROBLEMS else "")
    share = len(problems) / total
    if len(problems) == total:
        raise UserError(f"{what}: none of the {total} rows can be used: {shown}")
    if share > MAX_DROPPED_FRACTION:
        raise UserError(f"{what}: {len(problems)} of {total} rows ({share:.0%}) cannot be used, more than the "
                        f"{MAX_DROPPED_FRACTION:.0%} allowed: {shown}")
    return f"{what}: dropped {len(problems)} of {total} rows ({share:.0%}) that cannot be used: {shown}"


@dataclass
class Work:
    """What prepare's steps share: the job, how a row converts, and what the user is told, in order."""

    cfg: JobConfig
    tokenizer: Any
    convert: Converter
    fix: Any = None  # what each converted example goes through, if anything
    renderer: Renderer | None = None  # how conversations become tokens and a per-turn mask (chat_mask.py)
    pairs: Renderer | None = None  # how preference conversations with tool calls become text (chat_mask.py)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    clipped: list[str] = field(default_factory=list)  # where rows were cut as text, training's then eval's
    dropped: int = 0

    def usable(self, rows: list[Row], what: str) -> tuple[list[dict[str, Any]], list[Row]]:
        """The rows' examples and, in their order, the rows they came from; the unusable ones dropped and counted
        (a warning), or the job refused when there are too many."""
        sources: list[Row] = []
        examples, problems = _usable(rows, self.convert, self.cfg, self.tokenizer, self.fix, self.clipped, sources)
        warning = check_drops(what, len(rows), problems)
        if warning:
            self.warnings.append(warning)
        self.dropped += len(problems)
        return examples, sources


@dataclass
class Split:
    """The examples trained on and those evaluated, each with the rows they came from, in the same order."""

    train: list[dict[str, Any]]
    eval: list[dict[str, Any]]
    train_rows: list[Row]
    eval_rows: list[Row]
    held: dict[str, Any] | None = None  # which rows were held out (held_out.record), when it held some out


def split_eval(work: Work, rows: Rows, examples: list[dict[str, Any]], sources: list[Row]) -> Split:
    """The eval rows: the job's eval split, else (with eval_steps) the rows an earlier job held out (its resume,
    its clone), else rows held out by the job's seed."""
    if rows.eval is not None:
        return _eval_split(work, rows.eval, examples, sources)
    if work.cfg.eval_steps > 0 and work.cfg.held_out_rows:
        return _reused_held_out(work, examples, sources)
    if work.cfg.eval_steps > 0:
        return _seeded_hold_out(work, examples, sources)
    return Split(examples, [], sources, [])


def _eval_split(work: Work, eval_rows: list[Row], examples: list[dict[str, Any]], sources: list[Row]) -> Split:
    cfg = work.cfg
    if not eval_rows:
        raise UserError(f"eval_split {cfg.eval_split!r} is empty")
    eval_examples, eval_sources = work.usable(eval_rows, f"eval split {cfg.eval_split}")
    if cfg.eval_steps > 0:
        work.notes.append(f"eval: {len(eval_examples)} rows from eval_split {cfg.eval_split!r}")
        return Split(examples, eval_examples, sources, eval_sources)
    # converted and checked all the same: an unusable eval split is refused either way
    work.warnings.append(f"eval_split {cfg.eval_split!r} is set but eval_steps is 0, so there is no eval")
    return Split(examples, [], sources, [])


def _reused_held_out(work: Work, examples: list[dict[str, Any]], sources: list[Row]) -> Split:
    cfg = work.cfg
    previous = held_out_mod.read(cfg.held_out_rows)
    split = held_out_mod.reuse(previous, sources, cfg.held_out_rows)
    work.notes.append(split.note)
    if split.warning:
        work.warnings.append(split.warning)
    record = held_out_mod.record(sources, split.held, previous.get("seed", cfg.random_seed), cfg.held_out_rows)
    return _picked(examples, sources, split.train, split.held, record)


def _seeded_hold_out(work: Work, examples: list[dict[str, Any]], sources: list[Row]) -> Split:
    cfg = work.cfg
    n_eval = eval_size(len(examples), cfg.eval_fraction)
    if not n_eval:
        work.warnings.append(f"eval_steps is set but the dataset has only {len(examples)} rows "
                             f"({'fewer than 2' if cfg.eval_fraction else 'fewer than 32'}) and no eval_split; no eval")
        return Split(examples, [], sources, [])
    kept, held = hold_out(list(range(len(examples))), n_eval, cfg.random_seed)
    split = _picked(examples, sources, kept, held, held_out_mod.record(sources, held, cfg.random_seed, None))
    work.notes.append(f"eval: held out {n_eval} of {n_eval + len(split.train)} rows for evaluation "
                      f"(seed {cfg.random_seed})")
    return split


def _picked(examples: list[dict[str, Any]], sources: list[Row], train: list[int], held: list[int],
            record: dict[str, Any]) -> Split:
    """The split by index: `train` and `held` number examples (and sources, their rows)."""
    return Split([examples[i] for i in train], [examples[i] for i in held],
                  [sources[i] for i in train], [sources[i] for i in held], record)
