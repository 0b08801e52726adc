"""Make the bundled speech dataset (examples/data/speech/): short clips of a closed vocabulary, "<digit> <colour>"
("three red"), synthesised by espeak-ng and saved as 16 kHz mono 16-bit WAV, with a transcripts file per split
(`train/metadata.csv`, `test/metadata.csv`: file_name,text; the layout of people's own recordings).

Held out by voice, speed and pitch: the test clips are spoken by accents and voice variants that no training clip
uses, at a speed and pitch between the training ones, so a test clip is never a near copy of a training clip. Every
phrase (10 digits x 6 colours) is in both splits: the tiny model learns a closed set, as every demo of it does.

Run once, by hand (`apt-get install espeak-ng`; `.venv/bin/python examples/data/speech/make_clips.py`); the clips
are kept in the repository, so neither setup nor the tests need espeak-ng. Deterministic for one espeak-ng build.
"""

from __future__ import annotations

import csv
import io
import random
import shutil
import subprocess
from pathlib import Path

import numpy as np
import soundfile
import soxr

HERE = Path(__file__).resolve().parent
RATE = 16_000
DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
COLOURS = ("red", "green", "blue", "yellow", "black", "white")
TRAIN_VOICES = [f"{accent}+{variant}" for accent in ("en-gb", "en-us", "en-gb-scotland", "en-029")
                for variant in ("m1", "m3", "f2", "f4")]
TEST_VOICES = [f"{accent}+{variant}" for accent in ("en-gb-x-rp", "en-gb-x-gbcwmd") for variant in ("m2", "f1")]
TRAIN_SPEEDS, TRAIN_PITCHES = (130, 155, 185), (25, 45, 75)
TEST_SPEED, TEST_PITCH = 168, 60
TAKES = 4  # training clips per phrase
SILENCE = 0.01  # of the clip's peak: quieter samples at either end are cut
SEED = 2026


def speak(text: str, voice: str, speed: int, pitch: int) -> np.ndarray:
    wav = subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-p", str(pitch), "--stdout", text],
                         check=True, capture_output=True).stdout
    audio, rate = soundfile.read(io.BytesIO(wav), dtype="float32")
    audio = soxr.resample(audio, rate, RATE)
    loud = np.flatnonzero(np.abs(audio) > SILENCE * np.abs(audio).max())
    return audio[max(0, loud[0] - 800): loud[-1] + 800]  # 50 ms kept either side


def write(split: str, clips: list[tuple[str, str, int, int]]) -> None:
    folder = HERE / split
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    with (folder / "metadata.csv").open("w", newline="", encoding="utf-8") as out:
        table = csv.writer(out)
        table.writerow(["file_name", "text"])
        for n, (text, voice, speed, pitch) in enumerate(clips):
            name = f"{split}-{n:03d}.wav"
            soundfile.write(folder / name, speak(text, voice, speed, pitch), RATE, subtype="PCM_16")
            table.writerow([name, text])


def main() -> None:
    rng = random.Random(SEED)
    phrases = [f"{d} {c}" for d in DIGITS for c in COLOURS]
    train = [(p, rng.choice(TRAIN_VOICES), rng.choice(TRAIN_SPEEDS), rng.choice(TRAIN_PITCHES))
             for p in phrases for _ in range(TAKES)]
    test = [(p, rng.choice(TEST_VOICES), TEST_SPEED, TEST_PITCH) for p in phrases]
    rng.shuffle(train)
    write("train", train)
    write("test", test)
    print(f"{len(train)} training and {len(test)} test clips in {HERE}")


if __name__ == "__main__":
    main()
