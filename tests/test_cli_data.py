"""`tunestudio data inspect` as a user runs it (a real process, a real child): the report in the terminal, and
--json, which is the API's answer."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from rich.console import Console

from tunestudio.api import create_app
from tunestudio.cli import data as data_cli
from tunestudio.settings import Settings

from .helpers.hub_cache import hub_planted
from .helpers.planted import MAX_SEQ_LENGTH, Planted, write_planted

CLI = [sys.executable, "-m", "tunestudio.cli", "data", "inspect"]


def run(tmp_path: Path, *args: str, **env_vars: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TUNESTUDIO_HOME": str(tmp_path / "home"), "COLUMNS": "200", **env_vars}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=240)


@pytest.fixture
def planted(tmp_path: Path) -> Planted:
    return write_planted(tmp_path)


@pytest.mark.timeout(300)
def test_json_is_the_same_object_the_api_answers(planted: Planted, tiny_model: Path, tmp_path: Path) -> None:
    args = [str(planted.train), "--model", str(tiny_model), "--max-seq-length", str(MAX_SEQ_LENGTH),
            "--eval", str(planted.eval), "--dedupe", "exact"]
    proc = run(tmp_path, *args, "--json")
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)  # one JSON object, nothing else on stdout
    settings = Settings(home=tmp_path / "home", dataset_roots=[tmp_path], model_roots=[tiny_model.parent])
    with TestClient(create_app(settings), base_url="http://127.0.0.1:8765") as client:
        answer = client.post("/api/datasets/report", json={
            "local_datasets": [str(planted.train)], "model_name": str(tiny_model), "max_seq_length": MAX_SEQ_LENGTH,
            "eval_split": str(planted.eval), "dedupe": "exact"})
    assert answer.status_code == 200, answer.text
    served = answer.json()
    assert printed.pop("seconds") >= 0 and served.pop("seconds") >= 0  # the time it took differs
    assert printed == served
    assert (printed["duplicates"]["exact"], printed["duplicates"]["removed"]) == (len(planted.exact),
                                                                                  len(planted.exact))


@pytest.mark.timeout(300)
def test_the_terminal_report_names_the_faults(planted: Planted, tiny_model: Path, tmp_path: Path) -> None:
    proc = run(tmp_path, str(planted.train), "--model", str(tiny_model), "--max-seq-length", str(MAX_SEQ_LENGTH),
               "--held-out")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"rows: {planted.usable + len(planted.refused)} read, {planted.usable} usable, 3 refused" in out
    assert "train.jsonl:48 is not valid JSON" in out and "train.jsonl:50 has a prompt of" in out
    assert f"duplicates: {len(planted.exact)} exact" in out and f"{len(planted.near)} near" in out
    assert f"max_seq_length {MAX_SEQ_LENGTH} cuts {len(planted.long)} rows" in out
    assert "eval overlap: 16 eval rows (held-out split: 16 of 47 rows, seed 3407" in out


def test_bad_arguments_exit_2_and_an_unreadable_dataset_exits_1(tmp_path: Path) -> None:
    missing = run(tmp_path, str(tmp_path / "nope.jsonl"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    bad = run(tmp_path, str(tmp_path), "--dedupe", "fuzzy")
    assert bad.returncode == 2 and "dedupe" in bad.stderr
    odd = tmp_path / "odd.jsonl"
    odd.write_text('{"question": "q", "answer": "a"}\n')
    unreadable = run(tmp_path, str(odd))
    assert unreadable.returncode == 1 and "not a format tunestudio knows" in unreadable.stderr


def test_arguments_a_job_would_refuse_exit_2_naming_the_field(planted: Planted, tmp_path: Path) -> None:
    """--model "" is not "no model" (nor a model called anything); --eval-fraction needs --held-out, as
    eval_fraction needs eval_steps > 0 in a job."""
    empty = run(tmp_path, str(planted.train), "--model", "")
    assert empty.returncode == 2 and "model_name" in empty.stderr, empty.stderr
    fraction = run(tmp_path, str(planted.train), "--eval-fraction", "0.2")
    assert fraction.returncode == 2 and "eval_fraction" in fraction.stderr and "held_out" in fraction.stderr
    both = run(tmp_path, str(planted.train), "--held-out", "--eval", str(planted.eval), "--eval-fraction", "0.2")
    assert both.returncode == 2 and "unset eval_split" in both.stderr, both.stderr
    nothing = run(tmp_path)
    assert nothing.returncode == 2 and "give local_datasets or hf_dataset" in nothing.stderr, nothing.stderr


@pytest.mark.timeout(300)
def test_a_hub_dataset_and_its_eval_split(planted: Planted, tmp_path: Path) -> None:
    hub_planted(planted, tmp_path / "cache")
    proc = run(tmp_path, "--hf-dataset", "someorg/planted", "--eval", "test", "--json",
               HF_DATASETS_CACHE=str(tmp_path / "cache"), HF_ENDPOINT="http://127.0.0.1:9")
    assert proc.returncode == 0, proc.stderr
    overlap = json.loads(proc.stdout)["eval_overlap"]
    assert (overlap["source"], overlap["exact"], overlap["near"]) == ("eval_split 'test'", len(planted.eval_exact),
                                                                      len(planted.eval_near))


@pytest.mark.timeout(300)
def test_image_rows_are_reported_with_the_vision_models_processor(tmp_path: Path) -> None:
    """A folder with a captions file and a broken picture, measured by the tiny SmolVLM's processor in the real
    child: the images' part, and the row refused by name."""
    from .helpers.pictures import write_picture

    model = Path(__file__).resolve().parents[1] / "models" / "tiny-smolvlm"
    if not (model / "config.json").is_file():
        pytest.skip("the tiny SmolVLM is not built (make tiny-vision)")
    folder = tmp_path / "pictures"
    write_picture(folder / "a.png")
    (folder / "b.png").write_text("not a picture")
    (folder / "metadata.csv").write_text("file_name,caption\na.png,red\nb.png,broken\n")
    proc = run(tmp_path, str(folder), "--model", str(model), "--max-image-size", "32")
    assert proc.returncode == 0, proc.stderr
    assert "format images (detected)" in proc.stdout
    assert "images: 2 named, 1 read, 1 unreadable or missing" in proc.stdout
    assert "metadata.csv:3 image 1: image 1 (b.png) is not a readable image" in proc.stdout
    assert "image tokens a row:" in proc.stdout and "longest side 32 px" in proc.stdout


def test_the_histogram_marks_only_the_bins_max_seq_length_cuts_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """A row of exactly max_seq_length tokens fits: its bin is not marked (the page marks the same bins)."""
    console = Console(record=True, force_terminal=True, color_system="standard", highlight=False, width=120,
                      file=io.StringIO())
    monkeypatch.setattr(data_cli, "console", console)
    data_cli._histogram({"max_seq_length": 256, "histogram": {"edges": [254, 255, 256, 257, 258, 259],
                                                         "counts": [1, 2, 3, 4, 5]}})
    marked = [line.split()[0] for line in console.export_text(styles=True).splitlines() if "\x1b[31m" in line]
    assert marked == ["257–257", "258–258"]
