"""The dataset report on recordings: clips, durations, rates and channels, the clips over the window and the bad
ones named by file and line, as a job would refuse them."""

from __future__ import annotations

import csv
from pathlib import Path

from tunestudio.config import ReportSpec
from tunestudio.data_report.runner import make_report

from ..helpers.audio import WHISPER, wav_bytes


def test_the_report_counts_clips_and_names_every_bad_one(tmp_path: Path) -> None:
    folder = tmp_path / "recordings"
    folder.mkdir()
    (folder / "a.wav").write_bytes(wav_bytes(0.5))
    (folder / "b.wav").write_bytes(wav_bytes(1.0, rate=44_100, channels=2))
    (folder / "long.wav").write_bytes(wav_bytes(3.0))
    (folder / "notes.wav").write_text("not a recording")
    (folder / "forgotten.flac").write_bytes(wav_bytes(0.5))  # a recording no transcript names
    rows = [("a.wav", "one red"), ("b.wav", "two blue green"), ("long.wav", "a long one"), ("notes.wav", "x"),
            ("gone.wav", "y"), ("a.wav", "")]
    with (folder / "metadata.csv").open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["file_name", "text"])
        writer.writerows(rows)
    report = make_report(ReportSpec(local_datasets=[str(folder)], model_name=str(WHISPER)))
    assert (report["format"], report["rows"], report["usable"], report["refused_count"]) == ("audio", 6, 2, 4)
    reasons = {r["line"]: r["reason"] for r in report["refused"]}
    assert "3.0 s, longer than the model's window of 2 s" in reasons[4]
    assert "not readable audio" in reasons[5] and "does not exist" in reasons[6] and "empty transcript" in reasons[7]
    audio = report["audio"]
    assert audio["clips"] == 2 and abs(audio["total_seconds"] - 1.5) < 1e-3 and audio["window_seconds"] == 2.0
    assert audio["sample_rates"] == {"16000": 1, "44100": 1} and audio["channels"] == {"1": 1, "2": 1}
    assert audio["over_window"] == [{"file": str(folder / "metadata.csv"), "line": 4, "seconds": 3.0}]
    assert sum(audio["histogram"]["counts"]) == 2 and audio["transcript_words"]["max"] == 3
    assert "window 2 s" in report["notes"][0]
    assert audio["untranscribed_count"] == 1 and audio["untranscribed"][0].endswith("forgotten.flac")
