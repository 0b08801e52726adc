"""Audio: reading recordings and their transcripts, for speech-to-text jobs, the dataset report and transcription.

A row is a clip and its transcript, in any of the layouts people and the hub keep them:
- a folder of recordings with a transcripts file (`metadata.csv` or `.jsonl`: `file_name`, `text`), the layout of
  people's own recordings (split folders, `train/` and `test/`, hold their splits);
- JSON Lines or Parquet rows with an audio path or the audio's bytes (`audio`, `file_name`, `path`) and a text
  column (`text`, `transcript`, `transcription`, `sentence`);
- a hub dataset with an `Audio` feature (Common Voice's `path`/`sentence`, LibriSpeech's `file`/`text`), read
  undecoded (`datasets` would decode with torchcodec) and decoded here.
WAV, FLAC, MP3 and OGG are decoded by libsndfile (`soundfile`, whose wheels carry it with MP3), mixed to mono,
and resampled to the model's rate by `soxr`. A file path is read relative to its transcripts file and must lie
inside that folder. A clip that is not audio, empty, unreadable, or longer than the model's window (cutting it
would cut its transcript wrongly) is a RowProblem naming what is wrong; transcription (serving) splits long audio
into windows instead.
"""

from __future__ import annotations

import base64
import binascii
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tunestudio.worker.data.formats import RowProblem
from tunestudio.worker.data.rows import Row

AUDIO_COLUMNS = ("audio", "file_name", "path", "audio_path", "file")
TEXT_COLUMNS = ("text", "transcript", "transcription", "sentence", "normalized_text")
AUDIO_SUFFIXES = (".wav", ".flac", ".mp3", ".ogg", ".oga", ".opus", ".aiff", ".aif")


class TooLong(RowProblem):
    """A clip longer than the model's window (measured from its header, before it is decoded)."""

    def __init__(self, message: str, seconds: float) -> None:
        super().__init__(message)
        self.seconds = seconds


@dataclass(frozen=True)
class Clip:
    """A decoded clip: mono float32 samples at `rate` (the model's), and what it was."""

    samples: np.ndarray
    rate: int
    source_rate: int
    channels: int
    label: str  # what to call it (its file name, or "bytes")
    path: str | None = None  # its resolved file, when it is one
    raw: bytes | None = None  # its encoded bytes, when it came in the row

    @property
    def seconds(self) -> float:
        return len(self.samples) / self.rate

    @property
    def stored(self) -> dict[str, Any]:
        """Where to find it again (a batch decodes it when it needs it)."""
        return {"path": self.path, "bytes": self.raw}


def is_audio_row(data: dict[str, Any] | None) -> bool:
    """Whether a row names a recording: an audio column, or a file name with an audio suffix."""
    if not data:
        return False
    value = data.get("audio")
    if (isinstance(value, dict) and (value.get("bytes") or value.get("path"))) or isinstance(value, (bytes, bytearray)):
        return True
    for column in AUDIO_COLUMNS:
        named = data.get(column)
        if isinstance(named, dict):
            named = named.get("path")
        if isinstance(named, str) and Path(named.split("?")[0]).suffix.lower() in AUDIO_SUFFIXES:
            return True
    return False


def _source(data: dict[str, Any]) -> Any:
    for column in AUDIO_COLUMNS:
        value = data.get(column)
        if value not in (None, "", {}):
            return value
    raise RowProblem(f"has no audio (a column named one of {', '.join(AUDIO_COLUMNS)})")


def transcript(data: dict[str, Any]) -> str:
    for column in TEXT_COLUMNS:
        value = data.get(column)
        if isinstance(value, str):
            if not value.strip():
                raise RowProblem(f"has an empty transcript ({column})")
            return value.strip()
    raise RowProblem(f"has a recording but no transcript (a column named one of {', '.join(TEXT_COLUMNS)})")


def _encoded(source: Any, base: Path | None) -> tuple[bytes | None, str, str | None]:
    """(the bytes, when they came in the row; what to call the clip; its resolved file, when it is one)."""
    if isinstance(source, dict):  # the hub's Audio feature, undecoded
        if source.get("bytes"):
            return bytes(source["bytes"]), "bytes", None
        source = source.get("path")
    if isinstance(source, (bytes, bytearray)):
        return bytes(source), "bytes", None
    if not isinstance(source, str) or not source:
        raise RowProblem("its audio is not a path, a data: URL or bytes")
    if source.startswith("data:"):
        head, _, payload = source.partition(",")
        if ";base64" not in head:
            raise RowProblem("its audio data: URL must be base64-encoded")
        try:
            return base64.b64decode(payload, validate=True), "data: URL", None
        except (binascii.Error, ValueError):
            raise RowProblem("its audio data: URL's base64 is not valid") from None
    if source.startswith(("http://", "https://")):
        raise RowProblem(f"its audio is a web address ({source[:80]}); the studio fetches nothing: download it")
    path = Path(source.removeprefix("file://")).expanduser()
    if base is None:
        return None, source, str(path)
    full = (path if path.is_absolute() else base / path).resolve()
    if not full.is_relative_to(base.resolve()):
        raise RowProblem(f"its audio ({source}) lies outside the data file's folder {base}")
    if not full.is_file():
        raise RowProblem(f"its audio file {source} does not exist (next to {base})")
    return None, source, str(full)


def decode(source: Any, base: Path | None, rate: int, max_seconds: float | None = None) -> Clip:
    """One clip decoded to mono at `rate`; RowProblem when it is not audio, is empty, or is longer than
    `max_seconds` (checked from the file's header, before it is decoded)."""
    import soundfile
    import soxr

    raw, label, path = _encoded(source, base)
    opened: Any = io.BytesIO(raw) if raw is not None else path
    try:
        info = soundfile.info(opened)
        if raw is not None:
            opened.seek(0)
        if max_seconds is not None and info.frames > 0 and info.duration > max_seconds:
            raise TooLong(f"its audio ({label}) is {info.duration:.1f} s, longer than the model's window of "
                          f"{max_seconds:g} s: a training clip is never cut (its transcript would be cut wrongly); "
                          "split the recording and its transcript", info.duration)
        samples, source_rate = soundfile.read(opened, dtype="float32", always_2d=True)
    except RowProblem:
        raise
    except (RuntimeError, soundfile.LibsndfileError, TypeError, ValueError) as exc:
        raise RowProblem(f"its audio ({label}) is not readable audio (WAV, FLAC, MP3, OGG): {exc}") from None
    if samples.shape[0] == 0:
        raise RowProblem(f"its audio ({label}) is empty: no samples")
    channels = samples.shape[1]
    mono = samples.mean(axis=1) if channels > 1 else samples[:, 0]
    if source_rate != rate:
        mono = soxr.resample(mono, source_rate, rate)
    return Clip(np.ascontiguousarray(mono, dtype=np.float32), rate, int(source_rate), int(channels), label, path, raw)


def read_clip(row: Row, rate: int, max_seconds: float | None = None) -> tuple[Clip, str]:
    """A row's clip and transcript; RowProblem naming what is wrong."""
    if row.data is None:
        raise RowProblem(row.problem or "cannot be read")
    text = transcript(row.data)
    base = Path(row.source).parent if Path(row.source).is_file() else None  # a hub row's path is the hub's own
    return decode(_source(row.data), base, rate, max_seconds), text


def load_stored(stored: dict[str, Any], rate: int) -> np.ndarray:
    """A prepared row's clip (`Clip.stored`) decoded again, for a batch."""
    source: Any = stored.get("bytes") or stored.get("path")
    return decode(source, None, rate).samples


def untranscribed(rows: list[Row]) -> list[str]:
    """Recordings beside a transcripts file that none of its rows names (a transcript missing for a file): their
    paths, sorted. Hub rows and rows with embedded audio name no folder."""
    named: dict[Path, set[Path]] = {}
    for row in rows:
        source = Path(row.source)
        if not source.is_file():
            continue
        folder = source.parent
        names = named.setdefault(folder, set())
        try:
            value = _source(row.data or {})
        except RowProblem:
            continue
        if isinstance(value, dict):
            value = value.get("path")
        if isinstance(value, str) and not value.startswith(("data:", "http://", "https://")):
            names.add((folder / value).resolve())
    missing = []
    for folder, names in named.items():
        for path in folder.rglob("*"):
            if path.suffix.lower() in AUDIO_SUFFIXES and path.resolve() not in names and path.is_file():
                missing.append(str(path))
    return sorted(missing)
