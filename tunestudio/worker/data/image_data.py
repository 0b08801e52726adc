"""An image job's dataset: read, each row's images opened and checked, measured in tokens, split.

The text pipeline's steps where they fit (reading, slicing, the eval split, the held-out record, the drop rule),
with the image rows' own conversion (images.py) and length check in place of the text's rendering: TRL's vision
collator renders and tokenises each batch with the processor, so rows stay conversations with their images.

Each image is decoded once here, to check it and measure its row, and then let go: the prepared dataset keeps
where each image is (its file's path, or its bytes when it came in the row), as `datasets`' Image feature, which
decodes it again when a batch needs it. So preparing a dataset of photos holds one photo at a time, not all of them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from datasets import Dataset, List
from datasets import Image as ImageFeature

from tunestudio.config import JobConfig
from tunestudio.worker.data.formats import RowProblem
from tunestudio.worker.data.images import ImageRef, is_image_row, plan, read_row
from tunestudio.worker.data.pipeline import PreparedData, Work, check_drops, split_eval
from tunestudio.worker.data.rows import Row
from tunestudio.worker.data.sources import read_rows
from tunestudio.worker.data.split import slice_rows
from tunestudio.worker.errors import UserError


def filled(example: dict[str, Any]) -> list[dict[str, Any]]:
    """The row's messages with each placeholder holding its image, as TRL's vision collator fills them
    (trl.data_utils.prepare_multimodal_messages) before the processor renders them."""
    images = iter(example["images"])
    return [{**m, "content": [{**p, "image": next(images)} if p.get("type") == "image" else p for p in m["content"]]}
            if isinstance(m.get("content"), list) else m for m in example["messages"]]


def image_token_id(processor: Any) -> int | None:
    """The id of the token that stands for image features in the processor's text (SmolVLM's <image>, Qwen2-VL's
    <|image_pad|>), or None when the processor names none."""
    known = getattr(processor, "image_token_id", None)
    if isinstance(known, int):
        return known
    token = getattr(processor, "image_token", None)
    found = processor.tokenizer.convert_tokens_to_ids(token) if isinstance(token, str) else None
    return found if isinstance(found, int) and found != processor.tokenizer.unk_token_id else None


def measure(processor: Any, example: dict[str, Any]) -> tuple[int, int]:
    """(the row's length in tokens as the collator makes it, its images' tokens among them): rendered and tokenised
    as TRL's DataCollatorForVisionLanguageModeling does (no special tokens added: the template has them), and never
    truncated (a processor may cut at its tokenizer's model_max_length unless told not to)."""
    encoded = processor.apply_chat_template([filled(example)], tokenize=True, return_dict=True, processor_kwargs={
        "padding": False, "add_special_tokens": False, "truncation": False})
    ids = list(encoded["input_ids"][0])
    token = image_token_id(processor)
    return len(ids), (sum(1 for t in ids if t == token) if token is not None else 0)


def processed(processor: Any, example: dict[str, Any]) -> tuple[int, int]:
    """`measure`, or RowProblem when the model's processor refuses the row's images."""
    try:
        return measure(processor, example)
    except ValueError as exc:  # Qwen2-VL's family: a side under its patch or a longer side over 200 times the other
        sizes = ", ".join(f"{i.width} x {i.height}" for i in example["images"])
        raise RowProblem(f"has images the model's processor refuses ({sizes} px): {exc}") from None


def too_long(n: int, max_seq_length: int) -> str | None:
    """Why a row of n tokens is refused, or None when it fits."""
    if n <= max_seq_length:
        return None
    # never cut: a cut through an image's tokens leaves the model more image tokens than features
    return (f"is {n} tokens with its images, over max_seq_length {max_seq_length} (image rows are never cut: raise "
            "max_seq_length, or make the images smaller with max_image_size)")


def measured(processor: Any, example: dict[str, Any], max_seq_length: int) -> tuple[int, int]:
    """`processed`, or RowProblem when the row is longer than max_seq_length: what a job refuses, and the report
    lists, in the same words."""
    n, image = processed(processor, example)
    if (why := too_long(n, max_seq_length)) is not None:
        raise RowProblem(why)
    return n, image


def content_key(messages: list[dict[str, Any]], refs: Sequence[ImageRef]) -> str:
    """What makes two rows the same: their text and their images' content (the encoded bytes' hashes)."""
    digest = hashlib.sha256(json.dumps(messages, sort_keys=True, default=str).encode())
    for ref in refs:
        digest.update(ref.digest.encode())
    return digest.hexdigest()


@dataclass
class _ImageWork(Work):
    """The text pipeline's shared state, whose rows convert as image rows and are measured with the processor."""

    progress: Any = None  # called with (rows done, rows) while images are read
    keys: dict[tuple[str, int], str] = field(default_factory=dict)  # each usable row's content_key, by its place

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
        if (warning := check_drops(what, len(rows), problems)) is not None:
            self.warnings.append(warning)
        self.dropped += len(problems)
        return examples, sources

    def check(self, row: Row) -> dict[str, Any]:
        """The row checked and measured, as the dataset keeps it: its images as where to find them (ImageRef.stored),
        not their pixels."""
        if self.cfg.method == "dpo":
            return self.check_pair(row)
        example, refs = read_row(row)
        if self.tokenizer is not None:
            measured(self.tokenizer, example, self.cfg.max_seq_length)
        self.keys[(row.source, row.number)] = content_key(example["messages"], refs)
        return {"messages": example["messages"], "images": [ref.stored for ref in refs]}


    def check_pair(self, row: Row) -> dict[str, Any]:
        """A preference row with images (`prompt`, `chosen`, `rejected`, an `images` column or image parts in the
        prompt), as TRL's DPOTrainer takes it: the prompt's turns with their placeholders, both answers as turns;
        each conversation (prompt and answer) measured, the images opened once."""
        data = row.data or {}
        if data.get("chosen") is None or data.get("rejected") is None:
            raise RowProblem("needs `chosen` and `rejected` answers (method dpo)")
        prompt = _turns(data.get("prompt"), "user")
        if not prompt:
            raise RowProblem("needs a `prompt` (text or turns) for its images and answers")
        chosen, rejected = _turns(data["chosen"], "assistant"), _turns(data["rejected"], "assistant")
        if chosen == rejected:
            raise RowProblem("has the same chosen and rejected answer: the pair teaches nothing")
        pictures = {k: v for k, v in data.items() if k in ("images", "image")}
        example, refs = read_row(replace(row, data={**pictures, "messages": prompt + chosen}))
        other = plan(replace(row, data={**pictures, "messages": prompt + rejected}))
        if self.tokenizer is not None:
            for messages in (example["messages"], other.messages):
                measured(self.tokenizer, {"messages": messages, "images": example["images"]}, self.cfg.max_seq_length)
        n = len(prompt)
        self.keys[(row.source, row.number)] = content_key(example["messages"] + other.messages[n:], refs)
        return {"prompt": example["messages"][:n], "chosen": example["messages"][n:],
                "rejected": other.messages[n:], "images": [ref.stored for ref in refs]}


def _turns(value: Any, role: str) -> list[dict[str, Any]]:
    """A pair's prompt or answer as turns: text becomes one turn of `role`; turns stay as they are."""
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if isinstance(value, list) and all(isinstance(m, dict) and "role" in m for m in value):
        return list(value)
    if value is None:
        return []
    raise RowProblem(f"a {role} part must be text or a list of turns with roles")


def _dedupe(work: _ImageWork, examples: list[dict[str, Any]],
            sources: list[Row]) -> tuple[list[dict[str, Any]], list[Row], int]:
    if work.cfg.dedupe == "off":
        return examples, sources, 0
    seen: set[str] = set()
    kept: list[tuple[dict[str, Any], Row]] = []
    for example, row in zip(examples, sources, strict=True):
        key = work.keys[(row.source, row.number)]
        if key not in seen:
            seen.add(key)
            kept.append((example, row))
    removed = len(examples) - len(kept)
    work.notes.append(f"dedupe: removed {removed} of {len(examples)} rows repeating another's text and images "
                      "(image rows are compared exactly: the same text and the same image files' content)")
    return [e for e, _ in kept], [r for _, r in kept], removed


def _dataset(examples: list[dict[str, Any]]) -> Dataset:
    """The rows as a dataset whose images decode when read (upright, RGB: as images.py checked them)."""
    return Dataset.from_list(examples).cast_column("images", List(ImageFeature(mode="RGB")))


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
    split = split_eval(work, rows, examples, sources)
    images = sum(len(e["images"]) for e in split.train)
    work.notes.append(f"images: {images} in {len(split.train)} training rows"
                      + (f", {sum(len(e['images']) for e in split.eval)} in {len(split.eval)} eval rows"
                         if split.eval else ""))
    evals = _dataset(split.eval) if split.eval else None
    return PreparedData(
        train=_dataset(split.train),
        eval=evals,
        eval_examples=list(evals) if evals is not None else None,  # decoded: the evaluator answers them
        format_type="images",
        notes=work.notes,
        warnings=work.warnings,
        dropped=work.dropped,
        deduplicated=deduplicated,
        held_out=split.held,
        eval_places=[{"file": r.source, "line": r.number} for r in split.eval_rows] if split.eval else [],
    )
