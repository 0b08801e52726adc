"""A transcription's answer as text, JSON, verbose JSON, SubRip or WebVTT: shared by `/v1/audio/transcriptions` and
`tunestudio transcribe` (standard library only). A segment is (start s, end s, text)."""

from __future__ import annotations

import json
from typing import Any, Literal

FORMATS = ("json", "text", "verbose_json", "srt", "vtt")
Segment = tuple[float, float, str]


def _clock(seconds: float, separator: str) -> str:
    ms = round(seconds * 1000)
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    whole, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{whole:02d}{separator}{ms:03d}"


def subtitles(segments: list[Segment], kind: Literal["srt", "vtt"]) -> str:
    """The segments as SubRip (numbered cues, a comma before the milliseconds) or WebVTT (a header, a full stop)."""
    cues = []
    for n, (start, end, text) in enumerate(segments, 1):
        timing = f"{_clock(start, ',' if kind == 'srt' else '.')} --> {_clock(end, ',' if kind == 'srt' else '.')}"
        cues.append(f"{n}\n{timing}\n{text}\n" if kind == "srt" else f"{timing}\n{text}\n")
    return ("WEBVTT\n\n" if kind == "vtt" else "") + "\n".join(cues)


def verbose(text: str, language: str | None, duration: float, segments: list[Segment],
            task: str = "transcribe") -> dict[str, Any]:
    """OpenAI's verbose_json: the segments with their ids, times and text (`seek` in 10 ms frames, as Whisper's)."""
    return {"task": task, "language": language or "", "duration": duration, "text": text,
            "segments": [{"id": n, "seek": round(start * 100), "start": start, "end": end, "text": piece}
                         for n, (start, end, piece) in enumerate(segments)]}


def render(kind: str, text: str, language: str | None, duration: float, segments: list[Segment]) -> str:
    """The answer in `kind` (FORMATS) as the text a file or a terminal gets."""
    if kind == "text":
        return text + "\n"
    if kind in ("srt", "vtt"):
        return subtitles(segments, kind)  # type: ignore[arg-type]
    if kind == "json":
        return json.dumps({"text": text}, ensure_ascii=False) + "\n"
    return json.dumps(verbose(text, language, duration, segments), ensure_ascii=False, indent=1) + "\n"
