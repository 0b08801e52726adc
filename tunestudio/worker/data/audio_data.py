"""A speech-to-text job's dataset: each clip decoded and checked (audio.py), its transcript tokenised, split.

The text pipeline's steps where they fit (reading, slicing, the eval split, the held-out record, the drop rule).
Each clip is decoded once here, to check it (readable, not empty, within the model's window) and let go: the
prepared dataset keeps where the clip is (its file, or its bytes when it came in the row) and its transcript. When
all the clips' log-mel windows fit in FEATURE_BUDGET_BYTES they are made once, after the split (as Hugging Face's
Whisper recipe makes them with `dataset.map`), and a batch only stacks them; else `SpeechCollator` decodes each
batch's clips again into windows, so an hour of recordings is never held at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from datasets import Dataset

from tunestudio.config import JobConfig
from tunestudio.worker.data.audio import is_audio_row, load_stored, read_clip, untranscribed
from tunestudio.worker.data.formats import RowProblem
from tunestudio.worker.data.pipeline import PreparedData, Work, check_drops, split_eval
from tunestudio.worker.data.rows import Row
from tunestudio.worker.data.sources import read_rows
from tunestudio.worker.data.split import slice_rows
from tunestudio.worker.errors import UserError

FEATURE_BUDGET_BYTES = 1 << 30  # the clips' log-mel windows are made once when they take at most this
FEATURE_CHUNK = 32


def _feature_bytes(processor: Any) -> int:
    """One clip's log-mel window, in float32."""
    features = processor.feature_extractor
    return 4 * features.feature_size * features.nb_max_frames


def _with_features(examples: list[dict[str, Any]], processor: Any) -> Dataset:
    """The rows with each clip's log-mel window made now (as Hugging Face's Whisper recipe makes them with
    `dataset.map`), kept as a 2-D array column read as numpy: a batch then only stacks them."""
    import numpy as np
    from datasets import Array2D, Features, Value

    extractor = processor.feature_extractor
    rate = extractor.sampling_rate
    windows = []
    for start in range(0, len(examples), FEATURE_CHUNK):
        chunk = examples[start:start + FEATURE_CHUNK]
        windows.append(extractor([load_stored(e["audio"], rate) for e in chunk], sampling_rate=rate,
                                 return_tensors="np")["input_features"].astype(np.float32))
    shape = (extractor.feature_size, extractor.nb_max_frames)
    features = Features({"input_features": Array2D(shape, "float32"), "text": Value("string"),
                         "seconds": Value("float64"), "audio": {"path": Value("string"), "bytes": Value("binary")}})
    table = {"input_features": np.concatenate(windows), "text": [e["text"] for e in examples],
             "seconds": [e["seconds"] for e in examples], "audio": [e["audio"] for e in examples]}
    return Dataset.from_dict(table, features=features).with_format("numpy", columns=["input_features"],
                                                                    output_all_columns=True)


def window_seconds(processor: Any) -> float:
    """The model's input window: the feature extractor's chunk (30 s for real Whisper)."""
    features = processor.feature_extractor
    return features.n_samples / features.sampling_rate


def label_ids(processor: Any, text: str) -> list[int]:
    """The transcript as the decoder learns it: the tokenizer's prefix (start of transcript, language, task, no
    timestamps), the text, end of text."""
    return list(processor.tokenizer(text).input_ids)


@dataclass
class _AudioWork(Work):
    progress: Any = None
    seconds: list[float] = field(default_factory=list)

    def usable(self, rows: list[Row], what: str) -> tuple[list[dict[str, Any]], list[Row]]:
        examples, sources, problems = [], [], []
        rate = self.tokenizer.feature_extractor.sampling_rate
        window = window_seconds(self.tokenizer)
        for n, row in enumerate(rows, 1):
            try:
                clip, text = read_clip(row, rate, window)
                labels = label_ids(self.tokenizer, text)
                if len(labels) > self.cfg.max_seq_length:
                    raise RowProblem(f"has a transcript of {len(labels)} tokens, over max_seq_length "
                                     f"{self.cfg.max_seq_length}")
                target = getattr(self.tokenizer, "tunestudio_max_target", None)
                if target is not None and len(labels) > target:
                    raise RowProblem(f"has a transcript of {len(labels)} tokens, over the model's "
                                     f"{target} (max_target_positions)")
            except RowProblem as exc:
                problems.append(f"{row.where()} {exc}")
            else:
                examples.append({"audio": clip.stored, "text": text, "seconds": clip.seconds})
                sources.append(row)
                self.seconds.append(clip.seconds)
            if self.progress is not None and (n % 50 == 0 or n == len(rows)):
                self.progress(n, len(rows))
        if (warning := check_drops(what, len(rows), problems)) is not None:
            self.warnings.append(warning)
        self.dropped += len(problems)
        return examples, sources


def prepare_audio(cfg: JobConfig, processor: Any, progress: Any = None) -> PreparedData:
    """Read, decode, check and split a speech-to-text job's rows (PreparedData as the text pipeline makes it)."""
    rows = read_rows(cfg)
    train_rows = slice_rows(rows.train, cfg.dataset_slice_start, cfg.dataset_slice_end, f"dataset {rows.description}")
    if not any(is_audio_row(r.data) for r in train_rows[:20]):
        raise UserError(f"is_dataset_audio: dataset {rows.description} holds no recordings in its first rows (an "
                        "`audio` column, or a `file_name` of a .wav/.flac/.mp3/.ogg file, with a `text` "
                        "transcript); leave is_dataset_audio off for text data")
    work = _AudioWork(cfg, processor, convert=None, progress=progress,  # type: ignore[arg-type]
                      notes=[f"dataset: {len(train_rows)} rows from {rows.description}, read as recordings"])
    examples, sources = work.usable(train_rows, f"dataset {rows.description}")
    if lonely := untranscribed(rows.train + (rows.eval or [])):
        work.warnings.append(f"dataset: {len(lonely)} recordings have no transcript (no row names them), so they do "
                             f"not train: {', '.join(lonely[:5])}" + (" and more" if len(lonely) > 5 else ""))
    split = split_eval(work, rows, examples, sources)
    train_s, eval_s = sum(e["seconds"] for e in split.train), sum(e["seconds"] for e in split.eval)
    work.notes.append(f"audio: {len(split.train)} training clips, {train_s / 60:.1f} min"
                      + (f"; {len(split.eval)} eval clips, {eval_s / 60:.1f} min" if split.eval else "")
                      + f" (window {window_seconds(processor):g} s)")
    budget = FEATURE_BUDGET_BYTES
    size = (len(split.train) + len(split.eval)) * _feature_bytes(processor)
    if size <= budget:
        train, evals = _with_features(split.train, processor), (_with_features(split.eval, processor)
                                                               if split.eval else None)
        work.notes.append(f"audio: log-mel features made once, before training ({size / 2**20:.0f} MB in memory)")
    else:
        train, evals = Dataset.from_list(split.train), Dataset.from_list(split.eval) if split.eval else None
        work.notes.append(f"audio: log-mel features made for each batch (all of them would take {size / 2**20:.0f} "
                          f"MB, over the {budget / 2**20:.0f} MB kept in memory)")
    return PreparedData(
        train=train,
        eval=evals,
        eval_examples=list(split.eval) if split.eval else None,
        format_type="audio",
        notes=work.notes,
        warnings=work.warnings,
        dropped=work.dropped,
        held_out=split.held,
        eval_places=[{"file": r.source, "line": r.number} for r in split.eval_rows] if split.eval else [],
    )


class SpeechCollator:
    """A batch of prepared rows as the model takes it: each clip decoded and made a log-mel window by the feature
    extractor (`input_features`), each transcript tokenised as labels (padding masked with -100; the decoder's
    start token dropped, since the model puts it before the labels itself)."""

    def __init__(self, processor: Any, decoder_start_token_id: int) -> None:
        self.processor = processor
        self.start = decoder_start_token_id
        self.rate = processor.feature_extractor.sampling_rate

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        import numpy as np
        import torch

        if "input_features" in rows[0]:  # made once, at prepare
            batch = {"input_features": torch.from_numpy(np.stack([r["input_features"] for r in rows]))}
        else:
            arrays = [load_stored(r["audio"], self.rate) for r in rows]
            batch = self.processor.feature_extractor(arrays, sampling_rate=self.rate, return_tensors="pt")
        labels = self.processor.tokenizer([r["text"] for r in rows], padding=True, return_tensors="pt")
        ids = labels["input_ids"].masked_fill(labels["attention_mask"].ne(1), -100)
        if bool((ids[:, 0] == self.start).all()):
            ids = ids[:, 1:]
        return {"input_features": batch["input_features"], "labels": ids}
