"""A job's dataset, from where the user keeps it to what TRL's SFTTrainer trains on.

read (sources) → slice (split) → tell the format (formats) → convert each row → render
check (templates) → drop and count unusable rows → remove duplicates (dedupe, when
the job asks) → split off the eval rows (the eval split; or the rows an earlier job
held out: held_out; or seeded: split; the record of which rows is
`PreparedData.held_out`): `prepare`, a step a function.

Errors a user can cause name the file and the row (1-based, as an editor shows it).
"""

from __future__ import annotations

from typing import Any

from datasets import Dataset

from tunestudio.config import JobConfig
from tunestudio.worker.data import dedupe as dedupe_mod
from tunestudio.worker.data.audio import decode as decode_audio
from tunestudio.worker.data.audio import is_audio_row
from tunestudio.worker.data.chat_mask import renderer_for
from tunestudio.worker.data.formats import Converter, RowProblem, detect_format, resolve_format
from tunestudio.worker.data.held_out import write as write_held_out
from tunestudio.worker.data.images import is_image_row
from tunestudio.worker.data.pipeline import (
    MAX_DROPPED_FRACTION,
    SHOWN_PROBLEMS,
    PreparedData,
    Split,
    Work,
    check_drops,
    split_eval,
)
from tunestudio.worker.data.report import build, is_audio_data, is_image_data, load_tokenizer
from tunestudio.worker.data.rows import Rows
from tunestudio.worker.data.sources import SUPPORTED_SUFFIXES, Row, open_rows, read_file, read_head, read_rows
from tunestudio.worker.data.split import auto_eval_size, eval_size, hold_out, slice_rows
from tunestudio.worker.data.templates import (
    DEFAULT_CHAT_TEMPLATE,
    ensure_chat_template,
)

# What the rest of the worker, and the faces' children (api/preview.py, data_report/runner.py), use of data/.
__all__ = [
    "DEFAULT_CHAT_TEMPLATE",
    "MAX_DROPPED_FRACTION",
    "SUPPORTED_SUFFIXES",
    "PreparedData",
    "Row",
    "RowProblem",
    "Work",
    "auto_eval_size",
    "build",
    "check_drops",
    "decode_audio",
    "detect_format",
    "eval_size",
    "hold_out",
    "is_audio_data",
    "is_audio_row",
    "is_image_data",
    "is_image_row",
    "load_tokenizer",
    "open_rows",
    "prepare",
    "prepare_audio",
    "prepare_images",
    "read_file",
    "read_head",
    "resolve_format",
    "slice_rows",
    "speech_collator",
    "split_eval",
    "write_held_out",
]

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
    work = Work(cfg, tokenizer, convert, notes=notes)
    work.fix = _chat_template(work, train_rows)
    examples, sources = work.usable(train_rows, f"dataset {rows.description}")
    # before the split, so no held-out row repeats a training row it removes
    examples, sources, deduplicated = _dedupe(work, examples, sources)
    split = split_eval(work, rows, examples, sources)
    if work.clipped:
        work.notes.append(_clipped_note(work.clipped, cfg.max_seq_length))
    train, evals = split.train, split.eval
    if work.renderer is not None:  # conversations: tokenised here, with their per-turn mask (chat_mask.py)
        train, evals = _tokenised(work, split)
    elif work.pairs is not None and any(_has_tools(e) for e in split.train + split.eval):
        train, evals = _rendered_pairs(work, split)
    return PreparedData(
        train=Dataset.from_list(train),
        eval=Dataset.from_list(evals) if evals else None,
        eval_examples=split.eval if evals is not split.eval and split.eval else None,
        format_type=fmt,
        notes=work.notes,
        warnings=work.warnings,
        dropped=work.dropped,
        deduplicated=deduplicated,
        held_out=split.held,
        eval_places=[{"file": r.source, "line": r.number} for r in split.eval_rows] if split.eval else [],
    )


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


def _chat_template(work: Work, train_rows: list[Row]) -> Any:
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
    elif "chosen" in sample:
        work.pairs = renderer_for(tokenizer, cfg.reasoning, True)
    return None


def _tokenised(work: Work, split: Split) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The training and eval conversations as token rows with their masks; a row the template cannot render is
    dropped and counted (or the job refused when there are too many), naming its file and row."""
    assert work.renderer is not None
    everything = split.train + split.eval
    work.notes.extend(work.renderer.check(everything))
    out: list[list[dict[str, Any]]] = []
    for examples, rows, what in ((split.train, split.train_rows, "dataset"), (split.eval, split.eval_rows, "eval")):
        tokenised, problems = work.renderer.tokenise(examples, rows)
        if examples:
            warning = check_drops(f"{what}: rendering with the chat template", len(examples), problems)
            if warning:
                work.warnings.append(warning)
        work.dropped += len(problems)
        out.append(tokenised)
    return out[0], out[1]


def _has_tools(example: dict[str, Any]) -> bool:
    return bool(example.get("tools")) or any(
        isinstance(v, list) and any(isinstance(m, dict) and "tool_calls" in m for m in v) for v in example.values())


def _rendered_pairs(work: Work, split: Split) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Preference pairs with tools or tool calls as the template's text (Renderer.pair_text): every pair, so the
    dataset has one shape; a pair the template cannot render is dropped and counted, naming its row."""
    assert work.pairs is not None
    work.pairs.check([{"messages": e["prompt"] + e["chosen"] + e["rejected"], "tools": e.get("tools")}
                      for e in split.train + split.eval])
    out: list[list[dict[str, Any]]] = []
    for examples, rows, what in ((split.train, split.train_rows, "dataset"), (split.eval, split.eval_rows, "eval")):
        rendered, problems = [], []
        for example, row in zip(examples, rows, strict=True):
            try:
                rendered.append(work.pairs.pair_text(example))
            except RowProblem as exc:
                problems.append(f"{row.where()} {exc}")
        if examples and (warning := check_drops(f"{what}: rendering with the chat template", len(examples),
                                                 problems)):
            work.warnings.append(warning)
        work.dropped += len(problems)
        out.append(rendered)
    work.notes.append("preference pairs with tool calls: rendered with the model's chat template (tools included) "
                      "before the trainer tokenises them")
    return out[0], out[1]


def _dedupe(work: Work, examples: list[dict[str, Any]],
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


def _clipped_note(clipped: list[str], max_seq_length: int) -> str:
    where = ", ".join(clipped[:SHOWN_PROBLEMS]) + (" and more" if len(clipped) > SHOWN_PROBLEMS else "")
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


def prepare_audio(cfg: JobConfig, processor: Any, progress: Any = None) -> PreparedData:
    """A speech-to-text job's rows read, decoded, checked and split (audio_data.py)."""
    from tunestudio.worker.data.audio_data import prepare_audio as prepare

    return prepare(cfg, processor, progress)


def speech_collator(processor: Any, decoder_start_token_id: int) -> Any:
    """The collator of a speech-to-text job's batches (audio_data.SpeechCollator)."""
    from tunestudio.worker.data.audio_data import SpeechCollator

    return SpeechCollator(processor, decoder_start_token_id)


def prepare_images(cfg: JobConfig, processor: Any, progress: Any = None) -> PreparedData:
    """An image job's rows read, checked, measured and split (image_data.py)."""
    from tunestudio.worker.data.image_data import prepare_images as prepare

    return prepare(cfg, processor, progress)
