"""An audio job's before/after evaluation: each held-out clip transcribed by the base model and by the result (greedy,
the job's language and task), scored against its transcript by word and character error rate.

WER and CER are jiwer's, over all held-out clips together (errors summed over words summed, as speech papers give
them), after one normalisation of both sides, the same for both models: Unicode NFKC, case-folded, punctuation
removed (Unicode's P categories), spacing collapsed. The rows file keeps each clip's reference, both transcripts,
both error rates, and the clip itself as a WAV data: URL (clips up to PLAYABLE_S), so the page plays it beside them.
"""

from __future__ import annotations

import base64
import io
import json
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunestudio.events import BeforeAfter, EvalExample, Evaluation

SHOWN_EXAMPLES = 5  # the worst clips, in the evaluation event
PLAYABLE_S = 30.0
METRICS = ("wer", "cer")


def normalise(text: str) -> str:
    """What both sides of an error rate go through: NFKC, case-folded, punctuation removed, spacing collapsed."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = "".join(" " if unicodedata.category(c).startswith("P") else c for c in text)
    return " ".join(text.split())


def error_rates(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float | None]:
    """Corpus WER and CER (None without clips); an empty normalised reference counts as one word (jiwer refuses
    an empty one)."""
    import jiwer

    if not references:
        return {"wer": None, "cer": None}
    refs = [normalise(r) or "<empty>" for r in references]
    hyps = [normalise(h) for h in hypotheses]
    return {"wer": float(jiwer.wer(refs, hyps)), "cer": float(jiwer.cer(refs, hyps))}


@dataclass(frozen=True)
class Clip:
    audio: dict[str, Any]  # where the clip is (data/audio.Clip.stored)
    reference: str
    seconds: float
    place: dict[str, Any] | None


def transcribe(model: Any, processor: Any, samples: Any, language: str | None, task: str,
               max_new_tokens: int | None = None, **options: Any) -> str:
    """One window's transcript: greedy, unless `options` say otherwise (do_sample, temperature, prompt_ids)."""
    import torch

    rate = processor.feature_extractor.sampling_rate
    features = processor.feature_extractor(samples, sampling_rate=rate, return_tensors="pt").input_features
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    kwargs: dict[str, Any] = {"do_sample": False, **options}
    generation = getattr(model, "generation_config", None)
    if getattr(generation, "is_multilingual", True) is not False:  # an English-only model takes neither
        kwargs["task"] = task
        if language:
            kwargs["language"] = language
    limit = getattr(model.config, "max_target_positions", None)
    if limit and max_new_tokens:  # the prefix (and a prompt) and the new tokens share the decoder's positions
        prompt = options.get("prompt_ids")
        used = 4 + (len(prompt) if prompt is not None else 0)
        max_new_tokens = max(1, min(max_new_tokens, limit - used))
    if max_new_tokens:
        kwargs["max_new_tokens"] = max_new_tokens
    try:
        with torch.no_grad():
            output = model.generate(input_features=features.to(device, dtype=next(model.parameters()).dtype),
                                    **kwargs)
    finally:
        if was_training:
            model.train()
    ids = output.sequences if hasattr(output, "sequences") else output
    return processor.tokenizer.decode(ids[0], skip_special_tokens=True).strip()


def prefix_of(processor: Any) -> tuple[str | None, str]:
    """The language and task the processor's tokenizer puts before every transcript (the job's, as it trained)."""
    tokenizer = processor.tokenizer
    return getattr(tokenizer, "language", None), getattr(tokenizer, "task", None) or "transcribe"


def wav_url(samples: Any, rate: int) -> str:
    import soundfile

    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format="WAV", subtype="PCM_16")
    return "data:audio/wav;base64," + base64.b64encode(buffer.getvalue()).decode()


class SpeechEvaluator:
    """The text evaluator's interface (worker/main.py calls both alike) for held-out clips."""

    def __init__(self, rows: list[Clip]) -> None:
        self.rows = rows
        self.before: list[str] | None = None
        self.loss_before: float | None = None

    @classmethod
    def for_job(cls, examples: Iterable[dict[str, Any]] | None, limit: int,
                places: Sequence[dict[str, Any]] | None) -> SpeechEvaluator | None:
        if examples is None:
            return None
        rows = [Clip(e["audio"], e["text"], float(e.get("seconds") or 0), places[i] if places and i < len(places)
                     else None) for i, e in enumerate(examples)]
        return cls(rows[:limit] if limit > 0 else [])

    def _samples(self, row: Clip, processor: Any) -> Any:
        from tunestudio.worker.data import decode_audio

        stored = row.audio
        return decode_audio(stored.get("bytes") or stored.get("path"), None,
                            processor.feature_extractor.sampling_rate).samples

    def answers(self, model: Any, processor: Any, should_stop: Any = None, progress: Any = None) -> list[str] | None:
        out: list[str] = []
        language, task = prefix_of(processor)
        for row in self.rows:
            if should_stop is not None and should_stop():
                return None
            longest = len(processor.tokenizer(row.reference, add_special_tokens=False)["input_ids"])
            out.append(transcribe(model, processor, self._samples(row, processor), language, task, 2 * longest + 8))
            if progress is not None:
                progress(len(out), len(self.rows))
        return out

    def answer_before(self, model: Any, processor: Any, loss: float | None, should_stop: Any = None,
                      progress: Any = None) -> bool:
        self.loss_before = loss
        self.before = self.answers(model, processor, should_stop, progress)
        return self.before is not None

    def result(self, model: Any, processor: Any, loss_after: float | None, progress: Any = None,
               rows_file: Path | None = None) -> Evaluation:
        after = self.answers(model, processor, progress=progress) or []
        assert self.before is not None
        references = [r.reference for r in self.rows]
        first, last = error_rates(self.before, references), error_rates(after, references)
        metrics = {name: BeforeAfter(before=first[name], after=last[name]) for name in METRICS}
        metrics["eval_loss"] = BeforeAfter(before=self.loss_before, after=loss_after)
        each = [(r, b, a, error_rates([a], [r.reference])["wer"] or 0.0, error_rates([b], [r.reference])["wer"] or 0.0)
                for r, b, a in zip(self.rows, self.before, after, strict=True)]
        worst = sorted(each, key=lambda x: (-x[3], -x[4]))[:SHOWN_EXAMPLES]
        examples = [EvalExample(prompt=f"[clip {r.seconds:.1f} s]", reference=r.reference, before=b, after=a)
                    for r, b, a, _, _ in worst]
        written = None
        if rows_file is not None and self.rows:
            rate = processor.feature_extractor.sampling_rate
            records = [self._record(n, r, b, a, rate, processor) for n, (r, b, a, _, _) in enumerate(each)]
            rows_file.write_text(json.dumps({"loss": None, "metrics": list(METRICS), "rows": records},
                                            ensure_ascii=False) + "\n", encoding="utf-8")
            written = str(rows_file)
        return Evaluation(rows=len(self.rows), metrics=metrics, examples=examples, rows_file=written, scored_rows=0)

    def _record(self, n: int, row: Clip, before: str, after: str, rate: int, processor: Any) -> dict[str, Any]:
        record: dict[str, Any] = {
            "index": n, **(row.place or {"file": None, "line": None}), "prompt": f"[clip {row.seconds:.1f} s]",
            "reference": row.reference, "messages": None, "loss": None, "loss_before": None,
            "answer": after, "answer_before": before, "seconds": row.seconds,
            "audio": wav_url(self._samples(row, processor), rate) if row.seconds <= PLAYABLE_S else None,
        }
        for name in METRICS:
            record[name] = error_rates([after], [row.reference])[name]
            record[f"{name}_before"] = error_rates([before], [row.reference])[name]
        return record
