"""The tiny Whisper (models/tiny-whisper, built by make) and the bundled speech clips, for the audio tests."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
WHISPER = REPO / "models" / "tiny-whisper"
SPEECH = REPO / "examples" / "data" / "speech"
RATE = 16_000


def wav_bytes(seconds: float, rate: int = RATE, channels: int = 1, tone: float = 440.0) -> bytes:
    """A tone as a 16-bit WAV file's bytes."""
    import soundfile

    t = np.arange(int(seconds * rate)) / rate
    samples = (0.3 * np.sin(2 * np.pi * tone * t)).astype(np.float32)
    if channels > 1:
        samples = np.stack([samples] * channels, axis=1)
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()
