"""Reading recordings (worker/data/audio.py): the layouts, decoding and resampling, and each bad clip named."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tunestudio.worker.data import RowProblem, decode_audio, is_audio_row
from tunestudio.worker.data.audio import read_clip
from tunestudio.worker.data.rows import Row

from ..helpers.audio import RATE, SPEECH, wav_bytes


def test_a_stereo_44k_clip_is_mixed_to_mono_and_resampled_by_soxr(tmp_path: Path) -> None:
    import soundfile
    import soxr

    (tmp_path / "a.flac").write_bytes(b"")
    t = np.arange(44_100) / 44_100
    left, right = np.sin(2 * np.pi * 300 * t), np.sin(2 * np.pi * 500 * t)
    soundfile.write(tmp_path / "a.flac", np.stack([left, right], axis=1).astype(np.float32) * 0.5, 44_100)
    clip = decode_audio("a.flac", tmp_path, RATE)
    assert (clip.source_rate, clip.channels, clip.rate) == (44_100, 2, RATE)
    expected = soxr.resample(soundfile.read(tmp_path / "a.flac", dtype="float32")[0].mean(axis=1), 44_100, RATE)
    assert abs(clip.seconds - 1.0) < 1e-3 and np.allclose(clip.samples, expected, atol=1e-6)


def test_the_bundled_folder_layout_reads_file_name_and_text() -> None:
    line = (SPEECH / "train" / "metadata.csv").read_text().splitlines()[1].split(",")
    row = Row(str(SPEECH / "train" / "metadata.csv"), 2, {"file_name": line[0], "text": line[1]})
    assert is_audio_row(row.data)
    clip, text = read_clip(row, RATE, 2.0)
    assert text == line[1] and 0.4 < clip.seconds < 1.3 and clip.path.endswith(line[0])


@pytest.mark.parametrize(("data", "why"), [
    ({"file_name": "missing.wav", "text": "hi"}, "does not exist"),
    ({"file_name": "notes.wav", "text": "hi"}, "not readable audio"),
    ({"file_name": "empty.wav", "text": "hi"}, "empty: no samples"),
    ({"file_name": "long.wav", "text": "hi"}, "3.0 s, longer than the model's window of 2 s"),
    ({"file_name": "ok.wav", "text": "  "}, "empty transcript"),
    ({"file_name": "ok.wav"}, "no transcript"),
    ({"file_name": "../outside.wav", "text": "hi"}, "lies outside the data file's folder"),
    ({"audio": {"bytes": b"RIFF....WAVEjunk", "path": None}, "text": "hi"}, "not readable audio"),
])
def test_each_bad_clip_is_named_with_why(tmp_path: Path, data: dict, why: str) -> None:
    folder = tmp_path / "clips"
    folder.mkdir()
    (folder / "metadata.jsonl").write_text("")
    (folder / "notes.wav").write_text("these are my notes, not a recording")
    (folder / "empty.wav").write_bytes(wav_bytes(0.0))
    (folder / "long.wav").write_bytes(wav_bytes(3.0))
    (folder / "ok.wav").write_bytes(wav_bytes(0.5))
    (tmp_path / "outside.wav").write_bytes(wav_bytes(0.5))
    with pytest.raises(RowProblem, match=why):
        read_clip(Row(str(folder / "metadata.jsonl"), 3, data), RATE, 2.0)


def test_hub_style_rows_with_embedded_bytes_read(tmp_path: Path) -> None:
    row = Row("speech[train]", 1, {"audio": {"bytes": wav_bytes(0.5, rate=8000), "path": "x.wav"}, "sentence": "hi"})
    clip, text = read_clip(row, RATE, 2.0)
    assert text == "hi" and clip.source_rate == 8000 and len(clip.samples) == RATE // 2
    (tmp_path / "rows.jsonl").write_text(json.dumps({"audio": "a.mp3", "text": "x"}) + "\n")
    assert is_audio_row({"audio": "a.mp3", "text": "x"}) and not is_audio_row({"text": "a.mp3"})


def test_a_hub_dataset_with_an_audio_feature_is_read_undecoded_and_decoded_here(tmp_path: Path) -> None:
    from datasets import Audio, Dataset

    from tunestudio.config import ReportSpec
    from tunestudio.worker.data import open_rows

    saved = tmp_path / "voices"
    Dataset.from_dict({"audio": [{"bytes": wav_bytes(0.5, rate=8000), "path": "a.wav"}], "sentence": ["hi there"]}) \
        .cast_column("audio", Audio()).save_to_disk(str(saved))  # decoded on read, as the hub's Common Voice
    (row,) = list(open_rows(ReportSpec(hf_dataset=str(saved))).train)
    assert set(row.data["audio"]) == {"bytes", "path"}
    clip, text = read_clip(row, RATE, 2.0)
    assert text == "hi there" and clip.source_rate == 8000 and len(clip.samples) == RATE // 2


@pytest.mark.parametrize(("suffix", "fmt", "subtype"), [
    ("flac", "FLAC", "PCM_16"), ("mp3", "MP3", "MPEG_LAYER_III"), ("ogg", "OGG", "VORBIS"), ("opus", "OGG", "OPUS")])
def test_flac_mp3_ogg_and_opus_decode_to_the_same_length(tmp_path: Path, suffix: str, fmt: str, subtype: str) -> None:
    import soundfile

    t = np.arange(48_000) / 48_000
    soundfile.write(tmp_path / f"a.{suffix}", (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), 48_000,
                    format=fmt, subtype=subtype)
    clip = decode_audio(f"a.{suffix}", tmp_path, RATE)
    assert clip.source_rate == 48_000 and abs(clip.seconds - 1.0) < 0.08  # lossy codecs pad a frame or two
