"""The dataset report on image rows (worker/data/image_report.py, made in-process as the report's child makes it:
data_report/runner.make_report): a few
small pictures with a broken file, a missing one, a picture shown three times, a row repeated, a row too long and
an eval file that shows a training picture; and the terminal's lines for it (cli/data.py)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from tunestudio.cli import data as data_cli
from tunestudio.config import ReportSpec
from tunestudio.data_report.runner import make_report
from tunestudio.worker.errors import UserError

from ..helpers.pictures import BLUE, GREEN, RED, chat, picture, write_jsonl, write_picture

REPO = Path(__file__).resolve().parents[2]
SMOLVLM = REPO / "models" / "tiny-smolvlm"


def where(item: dict[str, Any]) -> tuple[str, int]:
    return Path(item["file"]).name, item["line"]


@pytest.fixture
def images(tmp_path: Path) -> Path:
    """train.jsonl: 1-3 pictures of their own (one a JPEG of another size), 4 a broken file, 5-7 one picture shown
    three times (6 repeats 5's text too), 8 a missing file, 9 a row far over max_seq_length; eval.jsonl shows 3's
    picture and 5's row."""
    write_picture(tmp_path / "pics" / "a.png", RED)
    write_picture(tmp_path / "pics" / "b.png", GREEN)
    (tmp_path / "pics" / "c.jpg").write_bytes(picture(BLUE, (30, 20), "JPEG"))
    (tmp_path / "pics" / "broken.png").write_text("not a picture")
    write_picture(tmp_path / "pics" / "same.png", (9, 9, 9))
    rows = [chat(["pics/a.png"], answer="red"), chat(["pics/b.png"], answer="green"),
            chat(["pics/c.jpg"], answer="blue"), chat(["pics/broken.png"]), chat(["pics/same.png"], answer="grey"),
            chat(["pics/same.png"], answer="grey"), chat(["pics/same.png"], answer="dark"),
            chat(["pics/gone.png"]), chat(["pics/a.png"], answer=" ".join(["red"] * 300))]
    write_jsonl(tmp_path / "eval.jsonl", [chat(["pics/c.jpg"], question="Which?", answer="blue"),
                                          chat(["pics/same.png"], answer="grey")])
    return write_jsonl(tmp_path / "train.jsonl", rows)


def spec(path: Path, **fields: Any) -> ReportSpec:
    return ReportSpec.model_validate({"local_datasets": [str(path)], "max_seq_length": 256, **fields})


def test_the_image_report_counts_sizes_formats_unreadable_files_and_repeats(images: Path) -> None:
    report = make_report(spec(images))
    assert (report["format"], report["rows"], report["usable"], report["refused_count"]) == ("images", 9, 7, 2)
    assert [(where(x), x["reason"][:38]) for x in report["refused"]] == [
        (("train.jsonl", 4), "image 1 (pics/broken.png) is not a rea"),
        (("train.jsonl", 8), "image 1 (pics/gone.png) cannot be read")]
    seen = report["images"]
    assert (seen["count"], seen["read"], seen["unreadable_count"], seen["formats"]) == (9, 7, 2, {"PNG": 6, "JPEG": 1})
    assert [(where(x), x["image"]) for x in seen["unreadable"]] == [(("train.jsonl", 4), 1), (("train.jsonl", 8), 1)]
    assert (seen["width"], seen["height"]) == ({"min": 16, "median": 16, "max": 30}, {"min": 12, "median": 12,
                                                                                        "max": 20})
    assert seen["sizes"] == [{"size": "16x12", "count": 6}, {"size": "30x20", "count": 1}]
    assert (seen["distinct"], seen["repeated"]) == (4, 3)  # a.png twice, same.png three times
    assert [(r["image"], r["count"], [where(x)[1] for x in r["rows"]]) for r in seen["repeats"]] == [
        ("pics/same.png", 3, [5, 6, 7]), ("pics/a.png", 2, [1, 9])]
    assert seen["tokens"] is None and report["lengths"] is None  # no model: no tokens
    dup = report["duplicates"]
    assert (dup["exact"], dup["near"], dup["removed"]) == (1, 0, 0)
    assert [[where(x)[1] for x in e["rows"]] for e in dup["examples"]] == [[5, 6]]
    assert dup["examples"][0]["text"] == "[image] What colour is it? | grey"
    assert report["columns"] == {"images": {"rows": 9, "empty": 0}, "messages": {"rows": 9, "empty": 0}}
    assert report["roles"] == {"assistant": {"turns": 7, "empty": 0}, "user": {"turns": 7, "empty": 0}}
    json.dumps(report)  # what the child sends back


def test_with_a_model_rows_are_measured_and_one_too_long_is_refused_never_cut(images: Path) -> None:
    if not (SMOLVLM / "config.json").is_file():
        pytest.skip("the tiny SmolVLM is not built (make tiny-vision)")
    report = make_report(spec(images, model_name=str(SMOLVLM), dedupe="exact"))
    assert report["usable"] == 6 and report["refused"][-1]["line"] == 9
    assert "over max_seq_length 256 (image rows are never cut" in report["refused"][-1]["reason"]
    lengths = report["lengths"]
    assert lengths["never_cut"] and (lengths["rows"], lengths["cut_rows"]) == (7, 1)  # the long row is measured
    tokens = report["images"]["tokens"]
    assert tokens["rows"] == 7 and tokens["per_row"]["min"] == tokens["per_row"]["max"] > 0  # one view an image
    assert report["duplicates"]["removed"] == 1
    assert "images: splitting off, longest side 64 px" in report["notes"]  # the processor set as the job sets it


def test_eval_rows_that_repeat_a_row_or_show_its_picture_are_named(images: Path, tmp_path: Path) -> None:
    overlap = make_report(spec(images, eval_split=str(tmp_path / "eval.jsonl")))["eval_overlap"]
    assert (overlap["eval_rows"], overlap["exact"], overlap["images"]) == (2, 1, 1)
    assert [(r["kind"], where(r["eval"])[1], where(r["train"])[1]) for r in overlap["rows"]] == [
        ("image", 1, 3), ("exact", 2, 5)]


def test_a_text_model_on_image_rows_is_refused_as_a_job_would_be(images: Path, tiny_model: Path) -> None:
    with pytest.raises(UserError, match="is a llama model without a vision tower: image datasets need a "
                                        "vision-language model"):
        make_report(spec(images, model_name=str(tiny_model)))


def test_the_terminal_shows_the_images_part(images: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    console = Console(record=True, width=200, file=io.StringIO())
    monkeypatch.setattr(data_cli, "console", console)
    data_cli.show(make_report(spec(images)))
    text = console.export_text()
    assert "images: 9 named, 7 read, 2 unreadable or missing; 1.0 a row (at most 1); width 16–30 px" in text
    assert "PNG 6, JPEG 1" in text
    assert "train.jsonl:4 image 1: image 1 (pics/broken.png) is not a readable image" in text
    assert "pics/same.png ×3: train.jsonl:5, train.jsonl:6, train.jsonl:7" in text
    assert "duplicates: 1 exact, 0 near" in text


def test_a_method_that_trains_text_only_reads_the_rows_as_text_as_its_job_would(images: Path) -> None:
    """modalities.detected keeps such a job text; so does the report, and the method's own check names the columns."""
    with pytest.raises(UserError, match=r"method 'kto' trains on unpaired .* the columns found are \['images', "
                                        r"'messages'\]"):
        make_report(spec(images, method="kto"))
