"""The dataset report on recordings (report.py hands them here when the first rows name recordings, as a job
detects them).

Each row is read as an audio job reads it (audio.read_clip: the same checks, refused in the same words): its clip
decoded (resampled to the model's rate when a model is given, else to 16 kHz) and let go. A recording longer than
the model's window is measured from its header only, and refused without being decoded. The answer has the
text report's keys, so the CLI and the page show it alike (refused rows with their file and line, columns), and an
`audio` part: clips, total and per-clip duration (a histogram), sample rates, channels, the clips over the model's
window, and transcript lengths in words and characters (and tokens, with a model).
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

import numpy as np

from tunestudio.config import ReportSpec
from tunestudio.worker.data.audio import TooLong, is_audio_row, read_clip, untranscribed
from tunestudio.worker.data.formats import RowProblem
from tunestudio.worker.data.rows import Opened, Row, Stream
from tunestudio.worker.data.tally import LISTED_REFUSED

DETECT_ROWS = 20
BINS = 10
OWN_RATE = 16_000  # without a model: clips are read at 16 kHz (what Whisper's family takes)


def holds_audio(rows: Iterable[Row]) -> bool:
    return any(is_audio_row(r.data) for r in itertools.islice(rows, DETECT_ROWS))


def _histogram(values: list[float]) -> dict[str, Any] | None:
    if not values:
        return None
    counts, edges = np.histogram(np.asarray(values), bins=BINS)
    return {"edges": [round(float(e), 3) for e in edges], "counts": [int(c) for c in counts]}


def _spread(values: list[float], digits: int = 2) -> dict[str, Any] | None:
    if not values:
        return None
    ordered = np.sort(np.asarray(values, dtype=np.float64))
    return {"min": round(float(ordered[0]), digits), "median": round(float(ordered[(len(ordered) - 1) // 2]), digits),
            "mean": round(float(ordered.mean()), digits), "max": round(float(ordered[-1]), digits)}


def build(cfg: ReportSpec, opened: Opened, rows: Stream, processor: Any, started: float) -> dict[str, Any]:
    """The report on recordings (`processor`: the model's, set as its job sets it; None: no window, no tokens)."""
    rate = processor.feature_extractor.sampling_rate if processor is not None else OWN_RATE
    window = processor.feature_extractor.n_samples / rate if processor is not None else None
    seconds: list[float] = []
    words: list[float] = []
    chars: list[float] = []
    tokens: list[float] = []
    rates: Counter[int] = Counter()
    channels: Counter[int] = Counter()
    columns: Counter[str] = Counter()
    refused: list[dict[str, Any]] = []
    over: list[dict[str, Any]] = []
    total = refused_count = over_count = 0
    for part in (rows, opened.eval) if opened.eval is not None else (rows,):
        for row in part:
            total += part is rows
            columns.update(k for k, v in (row.data or {}).items() if v not in (None, ""))
            try:
                clip, text = read_clip(row, rate, window)
            except TooLong as exc:  # refused by a job; listed here with its length
                over_count += 1
                refused_count += 1
                if len(over) < LISTED_REFUSED:
                    over.append({"file": row.source, "line": row.number, "seconds": round(exc.seconds, 2)})
                if len(refused) < LISTED_REFUSED:
                    refused.append({"file": row.source, "line": row.number, "reason": str(exc)})
                continue
            except RowProblem as exc:
                refused_count += 1
                if len(refused) < LISTED_REFUSED:
                    refused.append({"file": row.source, "line": row.number, "reason": str(exc)})
                continue
            if part is not rows:
                continue
            seconds.append(clip.seconds)
            rates[clip.source_rate] += 1
            channels[clip.channels] += 1
            words.append(len(text.split()))
            chars.append(len(text))
            if processor is not None:
                tokens.append(len(processor.tokenizer(text).input_ids))
    lonely = untranscribed([*rows, *(opened.eval or [])])
    audio = {
        "clips": len(seconds),
        "untranscribed_count": len(lonely),
        "untranscribed": lonely[:LISTED_REFUSED],
        "total_seconds": round(float(sum(seconds)), 2),
        "seconds": _spread(seconds),
        "histogram": _histogram(seconds),
        "sample_rates": {str(k): v for k, v in rates.most_common()},
        "channels": {str(k): v for k, v in channels.most_common()},
        "window_seconds": window,
        "over_window_count": over_count,
        "over_window": over,
        "transcript_words": _spread(words, 1),
        "transcript_chars": _spread(chars, 1),
        "transcript_tokens": _spread(tokens, 1),
    }
    return {
        "rows": total,
        "usable": len(seconds),
        "description": opened.description,
        "format": "audio",
        "detected": True,
        "refused_count": refused_count,
        "refused": refused,
        "duplicates": None,
        "lengths": None,
        "eval_overlap": None,
        "columns": {n: {"rows": c, "empty": 0} for n, c in sorted(columns.items())},
        "roles": {},
        "tools": None,
        "audio": audio,
        "notes": [] if processor is not None else
        ["no model given: the window and transcript tokens need the model's processor (--model); clips read at "
         f"{OWN_RATE} Hz"],
        "seconds": round(time.monotonic() - started, 3),
    }
