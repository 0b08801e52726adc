"""An image job's before/after evaluation: each held-out row's images and question answered by the base model and by
the result, scored against the row's answer with the text metrics (exact match, token F1, ROUGE-L).

The rows file (EVAL_ROWS_FILE) keeps, beside each answered row, a small PNG of its images as data: URLs, so the
page can show the picture next to both answers without reading the dataset again.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunestudio.events import BeforeAfter, EvalExample, Evaluation
from tunestudio.worker.train.text_scores import METRICS, score

SHOWN_EXAMPLES = 5
THUMBNAIL = 96  # pixels on the longest side of the pictures kept in the rows file
MAX_NEW_TOKENS = 64


@dataclass(frozen=True)
class ImageRow:
    messages: list[dict[str, Any]]  # the conversation before the reference answer
    images: list[Any]
    reference: str
    place: dict[str, Any] | None

    @property
    def shown(self) -> str:
        """The last user turn as text, its images as [image]."""
        content = self.messages[-1]["content"] if self.messages else ""
        if isinstance(content, str):
            return content
        return " ".join("[image]" if p.get("type") == "image" else str(p.get("text", "")) for p in content).strip()


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(str(p.get("text", "")) for p in content or [] if p.get("type") == "text")


def rows_of(examples: Iterable[dict[str, Any]], places: Sequence[dict[str, Any]] | None) -> list[ImageRow]:
    """The held-out examples whose last turn is the assistant's: what is asked, and the answer to compare with."""
    out = []
    for i, example in enumerate(examples):
        # a preference pair is asked its prompt and compared with its chosen answer
        messages = list(example["messages"]) if "messages" in example else [*example["prompt"], *example["chosen"]]
        if not messages or messages[-1].get("role") != "assistant":
            continue
        out.append(ImageRow(messages[:-1], list(example["images"]), _text(messages[-1].get("content")),
                            places[i] if places and i < len(places) else None))
    return out


def answer_with_images(model: Any, processor: Any, messages: list[dict[str, Any]], images: list[Any],
           max_new_tokens: int = MAX_NEW_TOKENS) -> str:
    """One greedy answer to the conversation and its images."""
    import torch

    was_training = model.training
    model.eval()
    inputs = processor.apply_chat_template([messages], images=[images] if images else None,
                                           add_generation_prompt=True, tokenize=True, return_dict=True,
                                           return_tensors="pt")
    device = next(model.parameters()).device
    inputs = {k: v.to(device) for k, v in inputs.items()}
    tokenizer = processor.tokenizer
    try:
        with torch.no_grad():
            output = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, use_cache=True,
                                    pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    finally:
        if was_training:
            model.train()
    return tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True).strip()


def thumbnail(image: Any) -> str:
    small = image.copy()
    small.thumbnail((THUMBNAIL, THUMBNAIL))
    buffer = io.BytesIO()
    small.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


class ImageEvaluator:
    """The text evaluator's interface (worker/main.py calls both alike) for rows with images."""

    def __init__(self, rows: list[ImageRow]) -> None:
        self.rows = rows
        self.before: list[str] | None = None
        self.loss_before: float | None = None

    @classmethod
    def for_job(cls, examples: Iterable[dict[str, Any]] | None, limit: int,
                places: Sequence[dict[str, Any]] | None = None) -> ImageEvaluator | None:
        if examples is None:
            return None
        return cls(rows_of(examples, places)[:limit] if limit > 0 else [])

    def answers(self, model: Any, processor: Any, should_stop: Any = None, progress: Any = None) -> list[str] | None:
        """Greedy answers to each row with its images; None if `should_stop()` said so between them."""
        answers: list[str] = []
        for row in self.rows:
            if should_stop is not None and should_stop():
                return None
            longest = len(processor.tokenizer(row.reference, add_special_tokens=False)["input_ids"])
            answers.append(answer_with_images(model, processor, row.messages, row.images,
                                              min(MAX_NEW_TOKENS, 2 * longest + 8)))
            if progress is not None:
                progress(len(answers), len(self.rows))
        return answers

    def answer_before(self, model: Any, processor: Any, loss: float | None, should_stop: Any = None,
                      progress: Any = None) -> bool:
        self.loss_before = loss
        self.before = self.answers(model, processor, should_stop, progress)
        return self.before is not None

    def result(self, model: Any, processor: Any, loss_after: float | None, progress: Any = None,
               rows_file: Path | None = None) -> Evaluation:
        from tunestudio.worker.train.evaluation import perplexity

        after = self.answers(model, processor, progress=progress) or []
        assert self.before is not None
        references = [r.reference for r in self.rows]
        first, last = score(self.before, references), score(after, references)
        metrics = {name: BeforeAfter(before=first.get(name), after=last.get(name)) for name in METRICS}
        metrics["eval_loss"] = BeforeAfter(before=self.loss_before, after=loss_after)
        metrics["perplexity"] = BeforeAfter(before=perplexity(self.loss_before), after=perplexity(loss_after))
        examples = [EvalExample(prompt=r.shown, reference=r.reference, before=b, after=a)
                    for r, b, a in list(zip(self.rows, self.before, after, strict=True))[:SHOWN_EXAMPLES]]
        written = None
        if rows_file is not None and self.rows:
            rows_file.write_text(json.dumps({
                "loss": None, "metrics": list(METRICS),
                "rows": [self._record(n, r, b, a) for n, (r, b, a) in
                         enumerate(zip(self.rows, self.before, after, strict=True))],
            }, ensure_ascii=False) + "\n", encoding="utf-8")
            written = str(rows_file)
        return Evaluation(rows=len(self.rows), metrics=metrics, examples=examples, rows_file=written,
                          scored_rows=0)  # no row's loss is measured one by one

    @staticmethod
    def _record(n: int, row: ImageRow, before: str, after: str) -> dict[str, Any]:
        record: dict[str, Any] = {
            "index": n, **(row.place or {"file": None, "line": None}), "prompt": row.shown,
            "reference": row.reference, "messages": None, "loss": None, "loss_before": None,
            "answer": after, "answer_before": before, "images": [thumbnail(i) for i in row.images],
        }
        for name, fn in METRICS.items():
            record[name], record[f"{name}_before"] = fn(after, row.reference), fn(before, row.reference)
        return record
