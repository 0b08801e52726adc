"""Image rows (worker/data/images.py): each layout read into {"messages", "images"}, and each kind of bad image
refused with a reason that names it. Pictures are a few pixels, written into tmp_path; no model is loaded."""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from tunestudio.config import ReportSpec
from tunestudio.worker.data.formats import RowProblem
from tunestudio.worker.data.images import MAX_IMAGES_PER_ROW, is_image_row, read_row
from tunestudio.worker.data.rows import Row
from tunestudio.worker.data.sources import read_rows

from ..helpers.pictures import (
    BLUE,
    GREEN,
    RED,
    chat,
    data_url,
    huge_png,
    openai_row,
    picture,
    write_jsonl,
    write_picture,
)

PLACEHOLDER = {"type": "image"}


def row_in(folder: Path, data: dict[str, Any], name: str = "train.jsonl", number: int = 1) -> Row:
    """The row as the readers give it: read from a file in `folder` (paths are relative to it)."""
    return Row(str(folder / name), number, data)


def pixels(image: Any) -> tuple[int, int, int]:
    return image.getpixel((image.width - 1, image.height - 1))


# --- the layouts --------------------------------------------------------------------------------------------
def test_the_hub_layout_reads_paths_relative_to_the_data_file(tmp_path: Path) -> None:
    red = write_picture(tmp_path / "pics" / "red.png", RED, (16, 12))
    write_picture(tmp_path / "pics" / "blue.jpg", BLUE, (8, 20), "JPEG")
    example, refs = read_row(row_in(tmp_path, chat(["pics/red.png", "pics/blue.jpg"])))
    assert [m["role"] for m in example["messages"]] == ["user", "assistant"]
    assert example["messages"][0]["content"][:2] == [PLACEHOLDER, PLACEHOLDER]
    assert [i.mode for i in example["images"]] == ["RGB", "RGB"]
    assert pixels(example["images"][0]) == RED
    assert [(r.label, r.format, r.size) for r in refs] == [("pics/red.png", "PNG", (16, 12)),
                                                            ("pics/blue.jpg", "JPEG", (8, 20))]
    assert refs[0].digest == hashlib.sha256(red.read_bytes()).hexdigest()  # duplicates are found by content


def test_openai_image_url_parts_take_data_urls_paths_and_file_urls_in_order(tmp_path: Path) -> None:
    write_picture(tmp_path / "green.png", GREEN)
    write_picture(tmp_path / "blue.png", BLUE)
    data = openai_row([data_url(picture(RED)), "green.png", f"file://{tmp_path / 'blue.png'}"])
    assert is_image_row(data)
    example, refs = read_row(row_in(tmp_path, data))
    assert example["messages"][0]["content"] == [{"type": "text", "text": "What colour is it?"}, *[PLACEHOLDER] * 3]
    # text as a text part: every turn a list of parts, as TRL's collator makes them (one Arrow type)
    assert example["messages"][1] == {"role": "assistant", "content": [{"type": "text", "text": "red"}]}
    assert [pixels(i) for i in example["images"]] == [RED, GREEN, BLUE]
    assert [r.label for r in refs] == ["data: URL", "green.png", f"file://{tmp_path / 'blue.png'}"]


@pytest.mark.parametrize("captions", ["metadata.csv", "captions.jsonl"])
def test_a_folder_with_a_captions_file_reads_through_local_datasets(tmp_path: Path, captions: str) -> None:
    folder = tmp_path / "pictures"
    write_picture(folder / "a.png", RED)
    write_picture(folder / "sub" / "b.png", GREEN)
    if captions.endswith(".csv"):
        (folder / captions).write_text("file_name,caption\na.png,a red square\nsub/b.png,a green square\n")
        asked = ["Describe the image.", "Describe the image."]
    else:
        write_jsonl(folder / captions, [{"file_name": "a.png", "question": "Which colour?", "answer": "red"},
                                        {"file_name": "sub/b.png", "question": "And this?", "answer": "green"}])
        asked = ["Which colour?", "And this?"]
    rows = read_rows(ReportSpec(local_datasets=[str(folder)]))  # the folder, not the file
    assert [(Path(r.source).name, r.number) for r in rows.train] == [(captions, 2 if captions.endswith(".csv")
                                                                      else 1), (captions, 3 if captions.endswith(".csv")
                                                                               else 2)]
    read = [read_row(r) for r in rows.train]
    assert [pixels(example["images"][0]) for example, _ in read] == [RED, GREEN]
    assert [example["messages"][0]["content"] for example, _ in read] == [
        [PLACEHOLDER, {"type": "text", "text": q}] for q in asked]
    assert [example["messages"][1]["content"][0]["text"] for example, _ in read] == (
        ["a red square", "a green square"] if captions.endswith(".csv") else ["red", "green"])


def _hub_parquet(path: Path, columns: dict[str, list[Any]], image_column: str, many: bool) -> Path:
    """A Parquet file in the hub's layout: the column as `datasets`' Image feature writes it ({"bytes", "path"})."""
    import datasets

    feature = datasets.Sequence(datasets.Image()) if many else datasets.Image()
    dataset = datasets.Dataset.from_dict(columns).cast_column(image_column, feature)
    dataset.to_parquet(str(path))
    return path


def test_a_parquet_file_in_the_hubs_layout_reads_embedded_images(tmp_path: Path) -> None:
    from tunestudio.worker.data.sources import read_file

    path = _hub_parquet(tmp_path / "train.parquet", {
        "images": [[{"bytes": picture(RED), "path": "red.png"}], [{"bytes": picture(BLUE, (9, 9)), "path": "b.png"}]],
        "messages": [chat(None, placeholders=1)["messages"], chat(None, answer="blue", placeholders=1)["messages"]],
    }, "images", many=True)
    rows = read_file(path)
    assert isinstance(rows[0].data["images"][0], dict) and set(rows[0].data["images"][0]) == {"bytes", "path"}
    read = [read_row(r) for r in rows]
    assert [pixels(example["images"][0]) for example, _ in read] == [RED, BLUE]
    assert [(refs[0].label, refs[0].size) for _, refs in read] == [("bytes", (16, 12)), ("bytes", (9, 9))]
    # Arrow gives every content part every key: an image part's "text" is None, and reads as a placeholder
    assert read[0][0]["messages"][0]["content"][0] == PLACEHOLDER


def test_a_hub_captioning_layout_an_image_and_its_caption_reads_as_a_caption_row(tmp_path: Path) -> None:
    from tunestudio.worker.data.sources import read_file

    path = _hub_parquet(tmp_path / "train.parquet", {"image": [{"bytes": picture(GREEN), "path": "g.png"}],
                                                     "text": ["a green square"]}, "image", many=False)
    example, _ = read_row(read_file(path)[0])
    assert pixels(example["images"][0]) == GREEN
    assert example["messages"][0]["content"][0] == PLACEHOLDER
    assert example["messages"][1]["content"] == [{"type": "text", "text": "a green square"}]


def test_plain_text_turns_get_the_images_before_the_first_user_turn_as_trl_places_them(tmp_path: Path) -> None:
    write_picture(tmp_path / "a.png", RED)
    data = {"images": ["a.png"], "messages": [{"role": "user", "content": "What colour?"},
                                              {"role": "assistant", "content": "red"}]}
    example, _ = read_row(row_in(tmp_path, data))
    assert example["messages"][0]["content"] == [PLACEHOLDER, {"type": "text", "text": "What colour?"}]
    assert example["messages"][1]["content"] == [{"type": "text", "text": "red"}]


def test_image_parts_holding_their_image_read_as_transformers_templates_take_them(tmp_path: Path) -> None:
    write_picture(tmp_path / "a.png", RED)
    data = {"messages": [{"role": "user", "content": [{"type": "image", "path": "a.png"},
                                                      {"type": "image", "image": data_url(picture(BLUE))},
                                                      {"type": "text", "text": "Which colours?"}]},
                         {"role": "assistant", "content": "red and blue"}]}
    assert is_image_row(data)
    example, _ = read_row(row_in(tmp_path, data))
    assert example["messages"][0]["content"] == [PLACEHOLDER, PLACEHOLDER, {"type": "text", "text": "Which colours?"}]
    assert [pixels(i) for i in example["images"]] == [RED, BLUE]


def test_a_photo_turned_by_its_exif_orientation_is_read_upright(tmp_path: Path) -> None:
    """As `datasets` and transformers' load_image read it (ImageOps.exif_transpose): the model sees the photo the
    way a viewer shows it, in training as in chat."""
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90° clockwise to show
    (tmp_path / "turned.jpg").write_bytes(picture(RED, (20, 10), "JPEG", exif=exif.tobytes()))
    example, refs = read_row(row_in(tmp_path, chat(["turned.jpg"])))
    assert example["images"][0].size == (10, 20)
    assert refs[0].size == (10, 20)


def test_a_text_row_is_not_an_image_row() -> None:
    assert not is_image_row({"messages": [{"role": "user", "content": "hi"}]})
    assert not is_image_row({"instruction": "a", "output": "b"})
    assert not is_image_row({"messages": [{"role": "user", "content": [{"type": ["odd"]}]}]})
    assert is_image_row(chat(["a.png"]))


# --- bad input ----------------------------------------------------------------------------------------------
def _truncated(folder: Path) -> str:
    from PIL import Image

    noise = Image.frombytes("RGB", (64, 64), os.urandom(64 * 64 * 3))
    out = io.BytesIO()
    noise.save(out, "PNG")
    (folder / "cut.png").write_bytes(out.getvalue()[: len(out.getvalue()) // 2])
    return "cut.png"


def _not_an_image(folder: Path) -> str:
    (folder / "notes.png").write_text("these are notes, not a picture\n")
    return "notes.png"


def _huge_header(folder: Path) -> str:
    (folder / "huge.png").write_bytes(huge_png())
    return "huge.png"


def _outside(folder: Path) -> str:
    write_picture(folder.parent / "elsewhere.png")
    return "../elsewhere.png"


def _absolute(folder: Path) -> str:
    return str(write_picture(folder.parent / "other" / "abs.png"))


def _linked_out(folder: Path) -> str:
    target = write_picture(folder.parent / "secret" / "s.png")
    (folder / "link.png").symlink_to(target)
    return "link.png"


def _missing(folder: Path) -> str:
    return "gone.png"


@pytest.mark.parametrize(("make", "reason"), [
    (_not_an_image, r"image 1 \(notes.png\) is not a readable image: no picture format Pillow reads$"),
    (_truncated, r"image 1 \(cut.png\) is not a readable image: .*truncated"),
    (_huge_header, r"image 1 \(huge.png\) is too large to decode safely"),
    (_outside, r"image 1 \(../elsewhere.png\) lies outside the data file's folder"),
    (_absolute, r"image 1 \(/.*abs.png\) lies outside the data file's folder"),
    (_linked_out, r"image 1 \(link.png\) lies outside the data file's folder"),
    (_missing, r"image 1 \(gone.png\) cannot be read: No such file"),
    (lambda folder: "https://example.com/cat.png", r"image 1 is a web address .*the studio fetches nothing"),
    (lambda folder: "data:image/png,notbase64", r"image 1: a data: URL must be base64-encoded"),
    (lambda folder: "data:image/png;base64,@@@", r"image 1: the data: URL's base64 is not valid"),
    (lambda folder: 42, r"image 1 is not a path, a data: URL or image bytes"),
])
def test_each_bad_image_is_refused_naming_it(tmp_path: Path, make: Any, reason: str) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    with pytest.raises(RowProblem, match=reason):
        read_row(row_in(folder, chat([make(folder)])))


def test_pillows_pixel_limit_is_an_error_not_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Over MAX_IMAGE_PIXELS Pillow only warns (an error from twice that): here both refuse the row."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    write_picture(tmp_path / "warns.png", size=(12, 12))  # 144 pixels: Pillow's warning
    write_picture(tmp_path / "fails.png", size=(20, 20))  # 400: Pillow's error
    for name in ("warns.png", "fails.png"):
        with pytest.raises(RowProblem, match=rf"image 1 \({name}\) is too large to decode safely"):
            read_row(row_in(tmp_path, chat([name])))
    write_picture(tmp_path / "fits.png", size=(10, 10))
    assert read_row(row_in(tmp_path, chat(["fits.png"])))[1][0].size == (10, 10)


@pytest.mark.parametrize(("images", "placeholders", "reason"), [
    (1, 2, r"has 1 image\(s\) but 2 image placeholder\(s\)"),
    (2, 1, r"has 2 image\(s\) but 1 image placeholder\(s\)"),
    (MAX_IMAGES_PER_ROW + 1, MAX_IMAGES_PER_ROW + 1, rf"has {MAX_IMAGES_PER_ROW + 1} images, more than the "
                                                     rf"{MAX_IMAGES_PER_ROW} a row may hold"),
])
def test_placeholders_must_match_the_images_and_a_row_holds_a_bounded_number(tmp_path: Path, images: int,
                                                                            placeholders: int, reason: str) -> None:
    write_picture(tmp_path / "a.png")
    with pytest.raises(RowProblem, match=reason):
        read_row(row_in(tmp_path, chat(["a.png"] * images, placeholders=placeholders)))


def test_a_row_naming_images_both_in_a_column_and_in_its_messages_is_refused(tmp_path: Path) -> None:
    """Their order against the placeholders would be a guess."""
    write_picture(tmp_path / "a.png")
    data = openai_row(["a.png"])
    data["images"] = ["a.png"]
    data["messages"][0]["content"].append(PLACEHOLDER)
    with pytest.raises(RowProblem, match="names images both in its `images` column and in its messages"):
        read_row(row_in(tmp_path, data))


def test_a_row_without_images_or_messages_says_what_it_lacks(tmp_path: Path) -> None:
    with pytest.raises(RowProblem, match="has no image"):
        read_row(row_in(tmp_path, chat([])))
    with pytest.raises(RowProblem, match="has a file_name but no caption"):
        read_row(row_in(tmp_path, {"file_name": "a.png"}))
    with pytest.raises(RowProblem, match="is not valid JSON"):
        read_row(Row(str(tmp_path / "x.jsonl"), 3, None, "is not valid JSON: Expecting value"))
    assert json.dumps(chat(["a.png"]))  # the helper's rows are JSON
