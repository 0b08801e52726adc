"""The dataset report: what a job's data holds before anything trains on it.

It reads and converts the rows with the worker's own code (`sources`, `formats`, `templates`, `dedupe`), in
the order `prepare` does: read → slice → tell the format → convert → refuse the rows training would drop →
(dedupe) → split off the eval rows. So a refused row here is a row the job drops, a duplicate here is one
`dedupe` removes, and the held-out rows are the ones the job holds out.

The rows are streamed, a chunk at a time (`tally.py`: what is kept of each row is a few numbers and a MinHash
signature in arrays), so memory grows with the rows' count by about 300 bytes a row, not with their text. The
few rows whose text the report quotes are read again at the end.

Token lengths are what the trainer tokenises (`tally.py`). A row is measured up to MEASURE_FACTOR times
max_seq_length tokens (at least MEASURE_MIN): a longer one is cut as text first and counted in
`clipped_rows`, so its length and lost tokens are lower bounds.

It reads what a `ReportSpec` says (the job's data fields; no model: no token lengths). Runs in a child process
(`tunestudio/data_report/runner.py` starts it, bounds its time and memory, and loads the model's tokenizer, or
for image rows its processor: `is_image_data`); `build` is its whole work and returns one JSON-ready dict, the
report. Rows with images (detected from the first rows, as a job detects them) are reported by `image_report.py`,
which answers the same keys and an `images` part.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from tunestudio.config import ReportSpec
from tunestudio.worker.data import audio_report, image_report, minhash
from tunestudio.worker.data import dedupe as dedupe_mod
from tunestudio.worker.data import held_out as held_out_mod
from tunestudio.worker.data.formats import Converter, RowProblem, resolve_format
from tunestudio.worker.data.lengths import summarise_lengths
from tunestudio.worker.data.rows import Opened, Stream
from tunestudio.worker.data.sources import open_rows
from tunestudio.worker.data.split import eval_size, hold_out, slice_rows
from tunestudio.worker.data.tally import LISTED_REFUSED, Reader, Tally
from tunestudio.worker.data.templates import ensure_chat_template, text_budget
from tunestudio.worker.errors import UserError

MEASURE_FACTOR = 4
MEASURE_MIN = 8192
LISTED_EXAMPLES = 10  # duplicate groups shown
LISTED_OVERLAP = 50  # eval rows found in the training rows, named
TEXT_CHARS = 300  # of an example's text shown


def build(cfg: ReportSpec, tokenizer: Any = None) -> dict[str, Any]:
    """The report on cfg's dataset; with a tokenizer, token lengths and the rows whose prompt fills
    max_seq_length (refused, as training refuses them). `cfg.dedupe` is the job's mode: it decides which rows
    are left for the held-out split. Raises UserError when the dataset cannot be read at all."""
    started = time.monotonic()
    opened = open_rows(cfg)
    rows = opened.train.window(cfg.dataset_slice_start, cfg.dataset_slice_end)
    if not rows.firsts():
        _nothing_to_read(cfg, opened)
    if _reads_images(cfg, rows):  # then `tokenizer` is the model's processor (is_image_data tells the caller)
        return image_report.build(cfg, opened, rows, tokenizer, started)
    if _reads_audio(cfg, rows):  # then `tokenizer` is the model's processor (is_audio_data tells the caller)
        return audio_report.build(cfg, opened, rows, tokenizer, started)
    fmt, convert, detected = resolve_format(cfg, rows)
    notes: list[str] = []
    fix = _fix(cfg, rows, convert, tokenizer, notes)
    measure = max(MEASURE_FACTOR * cfg.max_seq_length, MEASURE_MIN)
    reader = Reader(convert, fix, text_budget(tokenizer, measure), tokenizer, cfg.max_seq_length)
    reuses = cfg.held_out and cfg.held_out_rows is not None and opened.eval is None
    train = reader.read(rows, Tally(keys=reuses), columns=True)
    evals = reader.read(opened.eval, Tally()) if opened.eval is not None else None

    found = dedupe_mod.find_among(train.array("hashes"), train.signed)
    kept = np.flatnonzero(~found.removed(cfg.dedupe))
    duplicates, quoted = _duplicates(train, found, cfg.dedupe)
    texts = reader.texts(rows, {_place(train, i) for i in quoted}) if quoted else {}
    for example in duplicates["examples"]:
        example["text"] = _clip(texts[_place(train, example.pop("first"))])
        if "other" in example:
            example["other_text"] = _clip(texts[_place(train, example.pop("other"))])
    refused = train.refused + (evals.refused if evals is not None else [])
    return {
        "rows": train.rows,
        "usable": train.usable,
        "description": opened.description,
        "format": fmt,
        "detected": detected,
        "refused_count": train.refused_count + (evals.refused_count if evals is not None else 0),
        "refused": refused[:LISTED_REFUSED],
        "duplicates": duplicates,
        "lengths": summarise_lengths(train.array("tokens"), int(train.array("clipped").sum()), cfg.max_seq_length,
                                     measure) if tokenizer is not None else None,
        "eval_overlap": _overlap(cfg, train, kept, evals, found),
        "columns": {name: {"rows": train.present[name], "empty": train.blank[name]} for name in sorted(train.present)},
        "roles": {role: {"turns": train.turns[role], "empty": train.empty_turns[role]} for role in sorted(train.turns)},
        "tools": train.tool.report(int(train.array("tokens").sum()) if tokenizer is not None else None),
        "notes": notes + ([] if tokenizer is not None else
                          ["no model given: token lengths need the model's tokenizer (--model)"]),
        "seconds": round(time.monotonic() - started, 3),
    }


def _nothing_to_read(cfg: ReportSpec, opened: Opened) -> None:
    """Raise why there is no row: the dataset is empty, or the slice starts past its end (as a job says)."""
    total = sum(1 for _ in opened.train)
    if not total:
        raise UserError(opened.empty)
    slice_rows(range(total), cfg.dataset_slice_start, cfg.dataset_slice_end, f"dataset {opened.description}")
    raise UserError(opened.empty)  # not reached: the slice starts past the end


def is_image_data(cfg: ReportSpec) -> bool:
    """Whether the rows the report reads hold images (the first rows of its window, as a job detects them): then
    the model's processor measures them, not its tokenizer."""
    opened = open_rows(cfg)
    return _reads_images(cfg, opened.train.window(cfg.dataset_slice_start, cfg.dataset_slice_end))


def is_audio_data(cfg: ReportSpec) -> bool:
    """Whether the rows the report reads are recordings (the first rows of its window): then the model's processor
    reads them, not its tokenizer."""
    opened = open_rows(cfg)
    return _reads_audio(cfg, opened.train.window(cfg.dataset_slice_start, cfg.dataset_slice_end))


def _reads_audio(cfg: ReportSpec, rows: Stream) -> bool:
    from tunestudio.config import METHOD_SPECS

    return "audio" in METHOD_SPECS[cfg.method].modalities and audio_report.holds_audio(rows)


def _reads_images(cfg: ReportSpec, rows: Stream) -> bool:
    """As `modalities.detected` decides for a job: rows with images, and a method that trains images (a text
    method's own checks name such rows)."""
    from tunestudio.config import METHOD_SPECS

    return "image" in METHOD_SPECS[cfg.method].modalities and image_report.holds_images(rows)


def load_tokenizer(name: str) -> Any:
    """The model's tokenizer, found as `worker/train/model.py` finds it (a local folder; else the hub's cache, then
    the hub if it answers), without the modelling libraries that module imports (peft, bitsandbytes): the
    report starts in a few seconds, not fifteen. No token is passed: the environment's hub login applies."""
    from transformers import AutoTokenizer

    from tunestudio.paths import expand
    from tunestudio.worker import hub
    from tunestudio.worker.errors import UserError

    if expand(name).is_dir():
        try:
            return AutoTokenizer.from_pretrained(str(expand(name)))
        except (OSError, ValueError) as exc:
            raise UserError(f"model {name!r}: cannot load the tokenizer from this folder: {exc}") from exc
    if hub.looks_like_local_path(name):
        raise UserError(f"model {name!r} does not exist: there is no such folder")
    try:
        return AutoTokenizer.from_pretrained(name, local_files_only=True)
    except OSError:
        pass  # not in the cache: ask the hub
    hub.require_hub("model", name)
    try:
        return AutoTokenizer.from_pretrained(name)
    except OSError as exc:
        raise UserError(f"model {name!r}: cannot load the tokenizer from the hub: {exc}") from exc


# --- rows as training sees them -----------------------------------------------------
def _fix(cfg: ReportSpec, rows: Stream, convert: Converter, tokenizer: Any, notes: list[str]) -> Any:
    """What `prepare` does to conversations before training: the default chat template (every assistant turn is
    trained, with or without {% generation %} markers: chat_mask.py)."""
    sample = next((e for r in rows if r.data is not None and (e := _try(convert, r.data)) is not None), None)
    if tokenizer is None or sample is None or not ("messages" in sample or isinstance(sample.get("prompt"), list)):
        return None
    note = ensure_chat_template(tokenizer)
    if note:
        notes.append(note)
    return None


def _try(convert: Converter, data: dict[str, Any]) -> dict[str, Any] | None:
    try:
        return convert(data)
    except RowProblem:
        return None




# --- duplicates and overlap ------------------------------------------------------------
def _clip(text: str) -> str:
    return text if len(text) <= TEXT_CHARS else text[:TEXT_CHARS] + "…"


def _place(tally: Tally, i: int) -> tuple[str, int]:
    return tally.files[tally.file[i]], tally.line[i]


def _duplicates(train: Tally, found: dedupe_mod.Duplicates, mode: dedupe_mod.Mode,
                ) -> tuple[dict[str, Any], list[int]]:
    """(the duplicates' part of the report, its examples naming their rows' texts by index as "first" and
    "other"; the rows whose texts it quotes)."""
    copies = np.flatnonzero(found.copies)
    of = found.first[copies]
    groups, sizes = np.unique(of, return_counts=True)
    examples: list[dict[str, Any]] = []
    for at in sorted(range(len(groups)), key=lambda g: (-sizes[g], groups[g]))[:LISTED_EXAMPLES]:
        first = int(groups[at])
        rows = [first, *copies[of == first][: LISTED_EXAMPLES - 1].tolist()]
        examples.append({"kind": "exact", "count": int(sizes[at]) + 1, "first": first,
                         "rows": [train.where(i) for i in rows]})
    for i in np.flatnonzero(found.near_of >= 0)[:LISTED_EXAMPLES].tolist():
        first = int(found.near_of[i])
        examples.append({"kind": "near", "count": 2, "similarity": round(float(found.similarity[i]), 3),
                         "first": first, "other": i, "rows": [train.where(first), train.where(i)]})
    quoted = sorted({e["first"] for e in examples} | {e["other"] for e in examples if "other" in e})
    return {
        "exact": int(copies.size),
        "near": int((found.near_of >= 0).sum()),
        "threshold": dedupe_mod.NEAR_THRESHOLD,
        "method": dedupe_mod.method(),
        "dedupe": mode,
        "removed": int(found.removed(mode).sum()),
        "examples": examples,
    }, quoted


class _Places(Sequence[tuple[str, int]]):
    """(file, line) of the rows `rows` of a tally, read off its arrays when asked."""

    def __init__(self, tally: Tally, rows: np.ndarray) -> None:
        self.tally, self.rows = tally, rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: Any) -> Any:
        return _place(self.tally, int(self.rows[i]))


def _sides(cfg: ReportSpec, train: Tally, kept: np.ndarray, evals: Tally | None,
           ) -> tuple[str, np.ndarray, np.ndarray | None] | dict[str, Any]:
    """(what the eval rows are, the training rows, the held-out rows: None for an eval split's), or the
    overlap's answer when there are no eval rows."""
    if evals is not None:
        return f"eval_split {cfg.eval_split!r}", kept, None
    if cfg.held_out and cfg.held_out_rows:  # the rows an earlier job held out, as its clone holds them out
        keys = train.keys or []
        try:
            split = held_out_mod.reuse_keys(held_out_mod.read(cfg.held_out_rows), [keys[i] for i in kept],
                                            _Places(train, kept), cfg.held_out_rows)
        except UserError as exc:
            return {"source": None, "eval_rows": 0, "exact": 0, "near": 0, "rows": [], "note": str(exc)}
        return (f"held-out rows of {cfg.held_out_rows}: {len(split.held)} of {len(kept)} rows (as the job holds "
                "them out)", kept[split.train], kept[split.held])
    if cfg.held_out and (n_eval := eval_size(len(kept), cfg.eval_fraction)):
        training, held = hold_out(kept.tolist(), n_eval, cfg.random_seed)
        return (f"held-out split: {n_eval} of {len(kept)} rows, seed {cfg.random_seed} (as the job holds them out)",
                np.array(training, np.int64), np.array(held, np.int64))
    return {"source": None, "eval_rows": 0, "exact": 0, "near": 0, "rows": [],
            "note": "no eval rows: name an eval split, or hold rows out (held_out: a job with eval_steps > 0)"}


def _overlap(cfg: ReportSpec, train: Tally, kept: np.ndarray, evals: Tally | None,
             found: dedupe_mod.Duplicates) -> dict[str, Any]:
    """The eval rows that are also training rows: exactly, or near (same threshold as duplicates)."""
    sides = _sides(cfg, train, kept, evals)
    if isinstance(sides, dict):
        return sides
    source, training, held = sides
    if held is None:
        assert evals is not None
        side, rows = evals, np.arange(evals.usable)
    else:
        side, rows = train, held
    # exactly: the earliest training row with the same content
    contents, first = np.unique(found.hashes[training], return_index=True)
    at = np.minimum(np.searchsorted(contents, side.array("hashes")[rows]), max(len(contents) - 1, 0))
    exact = np.where(contents[at] == side.array("hashes")[rows], training[first[at]], -1) if len(contents) else \
        np.full(len(rows), -1)
    # nearly: an exact copy stands for its first row in the index; a row there stands for the earliest training
    # row with its content
    standing, earliest = np.unique(found.first[training], return_index=True)
    allowed = np.zeros(len(found.first), bool)
    allowed[standing] = True
    near, similarity = minhash.match(found.signed, allowed, side.signed.take(rows), side.signed.has[rows]) \
        if found.signed is not None else (np.full(len(rows), -1), np.zeros(len(rows)))
    named: list[dict[str, Any]] = []
    for k in np.flatnonzero((exact >= 0) | (near >= 0))[:LISTED_OVERLAP].tolist():
        hit, kind, sim = ((int(exact[k]), "exact", 1.0) if exact[k] >= 0 else
                          (int(training[earliest[np.searchsorted(standing, near[k])]]), "near", float(similarity[k])))
        named.append({"kind": kind, "similarity": round(sim, 3), "eval": side.where(int(rows[k])),
                      "train": train.where(hit)})
    return {"source": source, "eval_rows": len(rows), "exact": int((exact >= 0).sum()),
            "near": int(((exact < 0) & (near >= 0)).sum()), "rows": named,
            "eval_refused": evals.refused_count if evals is not None else 0}
