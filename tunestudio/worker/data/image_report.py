"""The dataset report on rows with images (report.py hands them here when the first rows hold images, as a job
detects them).

Each row is read as an image job reads it (images.plan, open_image: the same checks, refused in the same words),
every image decoded once and let go. What is kept of a row is its place, its content key (image_data.content_key:
text and images' hashes) and its images' hashes; of an image, its size and format. With a model, each row whose
images read is measured as the job measures it (image_data.processed, with the model's processor set as the job
sets it: modalities/image.set_for_cpu), and one over max_seq_length is refused (image rows are never cut).

The answer has the text report's keys, so the CLI and the page show it alike: refused rows (file and line),
duplicates (rows repeating another's text and images: what dedupe removes), token lengths, eval overlap (an eval
row that repeats a training row, or shows a training row's picture), columns and roles; and an `images` part: how
many, their sizes and formats, the unreadable or missing ones (file, line, which image, why), the pictures shown
more than once (by content hash), and the image tokens per row.
"""

from __future__ import annotations

import itertools
import time
from array import array
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tunestudio.config import ReportSpec
from tunestudio.worker.data.dedupe import NEAR_THRESHOLD
from tunestudio.worker.data.formats import RowProblem
from tunestudio.worker.data.image_data import content_key, processed, too_long
from tunestudio.worker.data.images import ImageRef, is_image_row, open_image, plan
from tunestudio.worker.data.lengths import summarise_lengths
from tunestudio.worker.data.rows import Opened, Row, Stream
from tunestudio.worker.data.split import eval_size, hold_out
from tunestudio.worker.data.tally import LISTED_REFUSED

DETECT_ROWS = 20  # the first rows that tell image data (modalities.detected reads as many)
LISTED = 10  # duplicate groups, repeated pictures, sizes
LISTED_OVERLAP = 50
TEXT_CHARS = 300


def holds_images(rows: Iterable[Row]) -> bool:
    return any(is_image_row(r.data) for r in itertools.islice(rows, DETECT_ROWS))


@dataclass
class _Seen:
    """One row as the job sees it: its conversation and images, which of them could not be read, why the job
    refuses it (None: usable), its length and image tokens (with a processor)."""

    row: Row
    messages: list[dict[str, Any]] | None = None
    refs: list[ImageRef] = field(default_factory=list)
    bad: list[tuple[int, str]] = field(default_factory=list)  # (image number, why)
    reason: str | None = None
    tokens: int | None = None
    image_tokens: int | None = None


def _see(row: Row, processor: Any, max_seq_length: int) -> _Seen:
    seen = _Seen(row)
    try:
        planned = plan(row)
    except RowProblem as exc:
        seen.reason = str(exc)
        return seen
    seen.messages = planned.messages
    for i, source in enumerate(planned.sources, 1):
        try:
            seen.refs.append(open_image(source, planned.base, f"image {i}"))
        except RowProblem as exc:
            seen.bad.append((i, str(exc)))
    if seen.bad:
        seen.reason = seen.bad[0][1]  # the job names the first
    elif processor is not None:
        try:
            seen.tokens, seen.image_tokens = processed(processor, {"messages": planned.messages,
                                                                   "images": [r.image for r in seen.refs]})
        except RowProblem as exc:
            seen.reason = str(exc)
        else:
            seen.reason = too_long(seen.tokens, max_seq_length)
    return seen


class _Tally:
    """What the report keeps of one split's rows (a few numbers and hashes a row; no pixels, no text)."""

    def __init__(self) -> None:
        self.rows = self.refused_count = self.unreadable_count = self.referenced = 0
        self.refused: list[dict[str, Any]] = []
        self.unreadable: list[dict[str, Any]] = []
        self.places: list[dict[str, Any]] = []  # usable rows'
        self.keys: list[str] = []
        self.digests: list[tuple[str, ...]] = []
        self.tokens, self.image_tokens = array("q"), array("q")  # rows measured (the over-long ones too)
        self.widths, self.heights, self.per_row = array("q"), array("q"), array("q")
        self.formats: Counter[str] = Counter()
        self.sizes: Counter[str] = Counter()
        self.shown: dict[str, list[Any]] = {}  # digest → [times shown, first label, first places]
        self.present: Counter[str] = Counter()
        self.blank: Counter[str] = Counter()
        self.turns: Counter[str] = Counter()
        self.empty_turns: Counter[str] = Counter()

    def add(self, seen: _Seen) -> None:
        self.rows += 1
        place = {"file": seen.row.source, "line": seen.row.number}
        for name, value in (seen.row.data or {}).items():
            self.present[name] += 1
            self.blank[name] += value is None or value in ("", [], {})
        if seen.messages is not None:
            self.per_row.append(len(seen.refs) + len(seen.bad))
            self.referenced += len(seen.refs) + len(seen.bad)
        for number, why in seen.bad:
            self.unreadable_count += 1
            if len(self.unreadable) < LISTED_REFUSED:
                self.unreadable.append({**place, "image": number, "reason": why})
        for ref in seen.refs:
            self._image(ref, place)
        if seen.tokens is not None:
            self.tokens.append(seen.tokens)
            self.image_tokens.append(seen.image_tokens or 0)
        if seen.reason is not None:
            self.refused_count += 1
            if len(self.refused) < LISTED_REFUSED:
                self.refused.append({**place, "reason": seen.reason})
            return
        assert seen.messages is not None
        self.places.append(place)
        self.keys.append(content_key(seen.messages, seen.refs))
        self.digests.append(tuple(r.digest for r in seen.refs))
        for turn in seen.messages:
            self.turns[turn["role"]] += 1
            self.empty_turns[turn["role"]] += not any(p.get("type") == "image" or (p.get("text") or "").strip()
                                                      for p in turn.get("content") or [])

    def _image(self, ref: ImageRef, place: dict[str, Any]) -> None:
        width, height = ref.size
        self.widths.append(width)
        self.heights.append(height)
        self.formats[ref.format or "unknown"] += 1
        self.sizes[f"{width}x{height}"] += 1
        entry = self.shown.setdefault(ref.digest, [0, ref.label, []])
        entry[0] += 1
        if len(entry[2]) < LISTED:
            entry[2].append(place)

    @property
    def usable(self) -> int:
        return len(self.keys)


def _read(rows: Iterable[Row], processor: Any, max_seq_length: int) -> _Tally:
    tally = _Tally()
    for row in rows:
        tally.add(_see(row, processor, max_seq_length))
    return tally


def build(cfg: ReportSpec, opened: Opened, rows: Stream, processor: Any, started: float) -> dict[str, Any]:
    """The report on image rows (`processor`: the model's, set as its job sets it; None: no lengths)."""
    train = _read(rows, processor, cfg.max_seq_length)
    evals = _read(opened.eval, processor, cfg.max_seq_length) if opened.eval is not None else None
    first, duplicates = _duplicates(train, cfg.dedupe)
    kept = np.array([i for i in range(train.usable) if first[i] == i or cfg.dedupe == "off"], np.int64)
    quoted = {(e["rows"][0]["file"], e["rows"][0]["line"]) for e in duplicates["examples"]}
    texts = _texts(rows, quoted)
    for example in duplicates["examples"]:
        example["text"] = texts.get((example["rows"][0]["file"], example["rows"][0]["line"]), "")
    lengths = None
    if processor is not None:
        lengths = summarise_lengths(np.frombuffer(train.tokens, np.int64) if train.tokens else np.zeros(0, np.int64),
                                    0, cfg.max_seq_length, None)
        lengths["never_cut"] = True  # the rows over max_seq_length are refused (listed), not cut
    refused = train.refused + (evals.refused if evals is not None else [])
    return {
        "rows": train.rows,
        "usable": train.usable,
        "description": opened.description,
        "format": "images",
        "detected": True,
        "refused_count": train.refused_count + (evals.refused_count if evals is not None else 0),
        "refused": refused[:LISTED_REFUSED],
        "duplicates": duplicates,
        "lengths": lengths,
        "eval_overlap": _overlap(cfg, train, kept, evals),
        "columns": {n: {"rows": train.present[n], "empty": train.blank[n]} for n in sorted(train.present)},
        "roles": {r: {"turns": train.turns[r], "empty": train.empty_turns[r]} for r in sorted(train.turns)},
        "tools": None,
        "images": _images(train, evals),
        "notes": [] if processor is not None else
        ["no model given: token lengths and image tokens need the model's processor (--model)"],
        "seconds": round(time.monotonic() - started, 3),
    }


def _spread(values: array, mean: bool = False) -> dict[str, Any] | None:
    if not values:
        return None
    ordered = np.sort(np.frombuffer(values, np.int64))
    out = {"min": int(ordered[0]), "median": int(ordered[(len(ordered) - 1) // 2]), "max": int(ordered[-1])}
    return {**out, "mean": round(float(ordered.mean()), 1)} if mean else out


def _images(train: _Tally, evals: _Tally | None) -> dict[str, Any]:
    """The images of the training rows: counts, sizes, formats, the unreadable ones, pictures shown more than once
    and their tokens. The eval rows' unreadable images are listed too (the job refuses their rows alike)."""
    repeats = sorted((e for e in train.shown.values() if e[0] > 1), key=lambda e: -e[0])
    unreadable = train.unreadable + (evals.unreadable if evals is not None else [])
    image_tokens = int(sum(train.image_tokens))
    return {
        "count": train.referenced,
        "read": len(train.widths),
        "per_row": _spread(train.per_row, mean=True),
        "width": _spread(train.widths),
        "height": _spread(train.heights),
        "formats": dict(train.formats.most_common()),
        "sizes": [{"size": s, "count": n} for s, n in train.sizes.most_common(LISTED)],
        "unreadable_count": train.unreadable_count + (evals.unreadable_count if evals is not None else 0),
        "unreadable": unreadable[:LISTED_REFUSED],
        "distinct": len(train.shown),
        "repeated": sum(e[0] - 1 for e in repeats),
        "repeats": [{"count": n, "image": label, "rows": places} for n, label, places in repeats[:LISTED]],
        "tokens": None if not train.tokens else {
            "rows": len(train.tokens), "per_row": _spread(train.image_tokens, mean=True),
            "per_image_mean": round(image_tokens / max(1, len(train.widths)), 1), "total": image_tokens,
            "share": round(image_tokens / max(1, int(sum(train.tokens))), 4)},
    }


def _duplicates(train: _Tally, mode: str) -> tuple[list[int], dict[str, Any]]:
    """(each usable row's first row with its content, the duplicates' part of the report): exact only, by text and
    images' content, as an image job's dedupe compares rows."""
    first_of: dict[str, int] = {}
    first = [first_of.setdefault(key, i) for i, key in enumerate(train.keys)]
    groups = Counter(f for i, f in enumerate(first) if f != i)
    examples = [{"kind": "exact", "count": n + 1,
                 "rows": [train.places[f], *[train.places[i] for i, g in enumerate(first) if g == f and i != f][
                     : LISTED - 1]]}
                for f, n in sorted(groups.items(), key=lambda g: (-g[1], g[0]))[:LISTED]]
    copies = sum(groups.values())
    return first, {"exact": copies, "near": 0, "threshold": NEAR_THRESHOLD,
                   "method": "image rows: the same text and the same images (content hashes); no near match",
                   "dedupe": mode, "removed": copies if mode != "off" else 0, "examples": examples}


def _texts(rows: Iterable[Row], wanted: set[tuple[str, int]]) -> dict[tuple[str, int], str]:
    """The text of the rows at the places wanted, images as [image], read again (no image opened)."""
    found: dict[tuple[str, int], str] = {}
    for row in rows:
        if len(found) == len(wanted):
            break
        if (place := (row.source, row.number)) in wanted:
            turns = plan(row).messages
            text = " | ".join(" ".join("[image]" if p.get("type") == "image" else str(p.get("text") or "")
                                       for p in t["content"] or []) for t in turns)
            found[place] = text if len(text) <= TEXT_CHARS else text[:TEXT_CHARS] + "…"
    return found


def _overlap(cfg: ReportSpec, train: _Tally, kept: np.ndarray, evals: _Tally | None) -> dict[str, Any]:
    """The eval rows that repeat a training row (text and images), or show a picture a training row shows."""
    if evals is not None:
        source, training, side, rows = f"eval_split {cfg.eval_split!r}", kept, evals, list(range(evals.usable))
    elif cfg.held_out and cfg.held_out_rows:
        return {"source": None, "eval_rows": 0, "exact": 0, "near": 0, "rows": [],
                "note": "held_out_rows: the overlap of an earlier job's held-out image rows is not reported yet"}
    elif cfg.held_out and (n_eval := eval_size(len(kept), cfg.eval_fraction)):
        training_list, held_list = hold_out(kept.tolist(), n_eval, cfg.random_seed)
        source = (f"held-out split: {n_eval} of {len(kept)} rows, seed {cfg.random_seed} (as the job holds them out)")
        training, side, rows = np.array(training_list, np.int64), train, held_list
    else:
        return {"source": None, "eval_rows": 0, "exact": 0, "near": 0, "rows": [],
                "note": "no eval rows: name an eval split, or hold rows out (held_out: a job with eval_steps > 0)"}
    keys = {train.keys[i]: i for i in reversed(training.tolist())}
    pictures = {d: i for i in reversed(training.tolist()) for d in train.digests[i]}
    named, exact, shared = [], 0, 0
    for k in rows:
        hit = keys.get(side.keys[k])
        kind = "exact" if hit is not None else "image"
        if hit is None:
            hit = next((pictures[d] for d in side.digests[k] if d in pictures), None)
        if hit is None:
            continue
        exact += kind == "exact"
        shared += kind == "image"
        if len(named) < LISTED_OVERLAP:
            named.append({"kind": kind, "similarity": 1.0, "eval": side.places[k], "train": train.places[hit]})
    return {"source": source, "eval_rows": len(rows), "exact": exact, "near": 0, "images": shared, "rows": named,
            "eval_refused": evals.refused_count if evals is not None else 0}
