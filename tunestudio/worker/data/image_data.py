"""An image job's dataset: read, each row's images opened and checked, measured in tokens, split.

The text pipeline's steps where they fit (reading, slicing, the eval split, the held-out record, the drop rule),
with the image rows' own conversion (images.py) and length check in place of the text's rendering: TRL's vision
collator renders and tokenises each batch with the processor, so rows stay conversations with their images.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from datasets import Dataset

from tunestudio.config import JobConfig
from tunestudio.worker.data import PreparedData, _check_drops, _split_eval, _Work, slice_rows
from tunestudio.worker.data.formats import RowProblem
from tunestudio.worker.data.images import is_image_row, read_row
from tunestudio.worker.data.rows import Row
from tunestudio.worker.data.sources import read_rows
from tunestudio.worker.errors import UserError


def image_tokens(processor: Any, example: dict[str, Any]) -> int:
    """The row's length in tokens as the collator will make it (its images' tokens included)."""
    encoded = processor.apply_chat_template([example["messages"]], images=[example["images"]], tokenize=True,
                                            return_dict=True, processor_kwargs={"padding": False})
    return len(encoded["input_ids"][0])


@dataclass
class _ImageWork(_Work):
    """The text pipeline's shared state, whose rows convert as image rows and are measured with the processor."""

    progress: Any = None  # called with (rows done, rows) while images are read

    def usable(self, rows: list[Row], what: str) -> tuple[list[dict[str, Any]], list[Row]]:
        examples, sources, problems = [], [], []
        for n, row in enumerate(rows, 1):
            try:
                example = self.check(row)
            except RowProblem as exc:
                problems.append(f"{row.where()} {exc}")
            else:
                examples.append(example)
                sources.append(row)
            if self.progress is not None and (n % 50 == 0 or n == len(rows)):
                self.progress(n, len(rows))
        if (warning := _check_drops(what, len(rows), problems)) is not None:
            self.warnings.append(warning)
        self.dropped += len(problems)
        return examples, sources

    def check(self, row: Row) -> dict[str, Any]:
        example, _ = read_row(row)
        if self.tokenizer is not None:
            n = image_tokens(self.tokenizer, example)
            if n > self.cfg.max_seq_length:
                # never cut: a cut through an image's tokens leaves the model more image tokens than features
                raise RowProblem(f"is {n} tokens with its images, over max_seq_length {self.cfg.max_seq_length} "
                                 "(image rows are never cut: raise max_seq_length, or make the images smaller "
                                 "with max_image_size)")
        return example


def _key(example: dict[str, Any]) -> str:
    """What makes two rows the same: their text and their images' pixels."""
    digest = hashlib.sha256(json.dumps(example["messages"], sort_keys=True).encode())
    for image in example["images"]:
        digest.update(image.tobytes())
    return digest.hexdigest()


def _dedupe(work: _ImageWork, examples: list[dict[str, Any]],
            sources: list[Row]) -> tuple[list[dict[str, Any]], list[Row], int]:
    if work.cfg.dedupe == "off":
        return examples, sources, 0
    seen: set[str] = set()
    kept: list[tuple[dict[str, Any], Row]] = []
    for example, row in zip(examples, sources, strict=True):
        key = _key(example)
        if key not in seen:
            seen.add(key)
            kept.append((example, row))
    removed = len(examples) - len(kept)
    work.notes.append(f"dedupe: removed {removed} of {len(examples)} rows repeating another's text and images "
                      "(image rows are compared exactly, pixels included)")
    return [e for e, _ in kept], [r for _, r in kept], removed


def prepare_images(cfg: JobConfig, processor: Any, progress: Any = None) -> PreparedData:
    """Read, check, measure and split an image job's rows (PreparedData as the text pipeline makes it)."""
    rows = read_rows(cfg)
    train_rows = slice_rows(rows.train, cfg.dataset_slice_start, cfg.dataset_slice_end, f"dataset {rows.description}")
    if not any(is_image_row(r.data) for r in train_rows[:20]):
        raise UserError(f"is_dataset_image: dataset {rows.description} holds no images in its first rows (an "
                        "`images` column with {\"type\": \"image\"} placeholders, image_url parts, or a file_name "
                        "with a caption); leave is_dataset_image off for text data")
    work = _ImageWork(cfg, processor, convert=None, progress=progress,  # type: ignore[arg-type]
                      notes=[f"dataset: {len(train_rows)} rows from {rows.description}, read as images"])
    examples, sources = work.usable(train_rows, f"dataset {rows.description}")
    examples, sources, deduplicated = _dedupe(work, examples, sources)
    split = _split_eval(work, rows, examples, sources)
    images = sum(len(e["images"]) for e in split.train)
    work.notes.append(f"images: {images} in {len(split.train)} training rows"
                      + (f", {sum(len(e['images']) for e in split.eval)} in {len(split.eval)} eval rows"
                         if split.eval else ""))
    return PreparedData(
        train=Dataset.from_list(split.train),
        eval=Dataset.from_list(split.eval) if split.eval else None,
        eval_examples=split.eval or None,
        format_type="images",
        notes=work.notes,
        warnings=work.warnings,
        dropped=work.dropped,
        deduplicated=deduplicated,
        held_out=split.held,
        eval_places=[{"file": r.source, "line": r.number} for r in split.eval_rows] if split.eval else [],
    )
