"""An image job's dataset (worker/data/image_data.py prepare_images, and the modality's processor check): rows
read, checked, measured with the tiny vision models' processors, deduplicated and split, every refused row named by
file and row. No model is trained or loaded: the processors are a few kilobytes of config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tunestudio.config import JobConfig
from tunestudio.worker.data import MAX_DROPPED_FRACTION
from tunestudio.worker.data.image_data import measure, prepare_images
from tunestudio.worker.errors import UserError
from tunestudio.worker.modalities.image import ImageModality

from ..helpers.jobs import DATA
from ..helpers.pictures import BLUE, RED, chat, colour_rows, huge_png, openai_row, write_jsonl, write_picture

REPO = Path(__file__).resolve().parents[2]
VISION = {"smolvlm": REPO / "models" / "tiny-smolvlm", "qwen2-vl": REPO / "models" / "tiny-qwen2-vl"}


def image_job(model: Path | str, *data: Path, **overrides: Any) -> JobConfig:
    return JobConfig.model_validate({"model_name": str(model), "local_datasets": [str(d) for d in data],
                                     "is_dataset_image": True, "max_seq_length": 256, **overrides})


@pytest.fixture(scope="module", params=sorted(VISION))
def processor(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A tiny vision model's processor as a job loads it (set for a CPU: images at the tower's size, no tiles)."""
    model = VISION[request.param]
    if not (model / "config.json").is_file():
        pytest.skip(f"{model} is not built (make tiny-vision)")
    data = colour_rows(tmp_path_factory.mktemp("rows"), 1)
    return ImageModality().load_processor(image_job(model, data))


def test_rows_are_measured_as_trls_vision_collator_makes_them(tmp_path: Path, processor: Any) -> None:
    """A row's measured length is the collator's, so no row that passes the check is cut in training."""
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    write_picture(tmp_path / "big.png", BLUE, (90, 40))
    path = write_jsonl(tmp_path / "train.jsonl", [chat(["big.png"]), openai_row(["big.png"], answer="a longer answer"),
                                                  {"file_name": "big.png", "caption": "blue"}])
    data = prepare_images(image_job("unused", path), processor)
    collate = DataCollatorForVisionLanguageModeling(processor)
    for row in data.train:
        tokens, image_tokens = measure(processor, row)
        assert collate([row])["input_ids"].shape[1] == tokens
        assert 0 < image_tokens < tokens


def test_a_row_longer_than_max_seq_length_is_refused_never_cut(tmp_path: Path, processor: Any) -> None:
    path = colour_rows(tmp_path, 4)
    rows = path.read_text().splitlines()
    write_picture(tmp_path / "long.png")
    long = chat(["long.png"], answer=" ".join(["word"] * 200))
    write_jsonl(path, [*map(__import__("json").loads, rows), long])
    data = prepare_images(image_job("unused", path, max_seq_length=128), processor)
    assert len(data.train) == 4 and data.dropped == 1
    assert data.warnings and f"dataset {path} row 5 is " in data.warnings[0]
    assert "over max_seq_length 128 (image rows are never cut" in data.warnings[0]


def test_a_picture_the_processor_refuses_is_refused_naming_its_row(tmp_path: Path, processor: Any) -> None:
    """Qwen2-VL's family takes no image whose long side is over 200 times its short one (a ValueError from deep in
    the processor, which stopped the job): the row is refused, named; SmolVLM resizes it."""
    path = colour_rows(tmp_path, 4)
    write_picture(tmp_path / "thin.png", size=(300, 1))
    write_jsonl(path, [*map(__import__("json").loads, path.read_text().splitlines()), chat(["thin.png"])])
    data = prepare_images(image_job("unused", path), processor)
    if type(processor).__name__.startswith("Qwen2"):
        assert data.dropped == 1
        assert f"dataset {path} row 5 has images the model's processor refuses (300 x 1 px)" in data.warnings[0]
    else:
        assert data.dropped == 0


def test_each_bad_row_is_named_by_file_and_row(tmp_path: Path) -> None:
    """Five bad rows among twelve good ones (under the drop limit): the job trains on the good ones and says where
    each bad one is and why."""
    path = colour_rows(tmp_path, 12)
    (tmp_path / "notes.png").write_text("not a picture")
    (tmp_path / "huge.png").write_bytes(huge_png())
    write_picture(tmp_path.parent / f"{tmp_path.name}-outside.png")
    bad = [chat(["notes.png"]), chat(["huge.png"]), chat([f"../{tmp_path.name}-outside.png"]),
           openai_row(["https://example.com/a.png"]), chat(["pics/00.png"], placeholders=2)]
    write_jsonl(path, [*map(__import__("json").loads, path.read_text().splitlines()), *bad])
    data = prepare_images(image_job("unused", path), None)
    assert (len(data.train), data.dropped) == (12, 5)
    said = data.warnings[0]
    for line, reason in [(13, "image 1 (notes.png) is not a readable image"),
                         (14, "image 1 (huge.png) is too large to decode safely"),
                         (15, "lies outside the data file's folder"),
                         (16, "image 1 is a web address"),
                         (17, "has 1 image(s) but 2 image placeholder(s)")]:
        assert f"dataset {path} row {line} {reason}"[:80] in said


def test_too_many_bad_rows_refuse_the_job(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "train.jsonl", [chat(["gone.png"])] * 3 + [chat(["a.png"])])
    write_picture(tmp_path / "a.png")
    with pytest.raises(UserError, match=rf"3 of 4 rows \(75%\) cannot be used, more than the "
                                        rf"{MAX_DROPPED_FRACTION:.0%} allowed: dataset {path} row 1 image 1 "
                                        r"\(gone.png\) cannot be read"):
        prepare_images(image_job("unused", path), None)


def test_is_dataset_image_on_text_data_is_refused() -> None:
    with pytest.raises(UserError, match=r"is_dataset_image: dataset .* holds no images in its first rows"):
        prepare_images(image_job("unused", DATA / "alpaca.jsonl"), None)


def test_a_text_model_given_image_data_is_refused_before_training(tiny_model: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="is a llama model without a vision tower: image datasets need a "
                                        "vision-language model"):
        ImageModality().load_processor(image_job(tiny_model, colour_rows(tmp_path, 1)))


def test_a_folder_with_a_captions_file_prepares_as_a_job_reads_it(tmp_path: Path) -> None:
    write_picture(tmp_path / "pics" / "a.png", RED)
    write_picture(tmp_path / "pics" / "b.png", BLUE)
    (tmp_path / "pics" / "metadata.csv").write_text("file_name,caption\na.png,red\nb.png,blue\n")
    data = prepare_images(image_job("unused", tmp_path / "pics"), None)
    assert len(data.train) == 2 and data.format_type == "images"
    assert [r["images"][0].getpixel((5, 5)) for r in data.train] == [RED, BLUE]


def test_progress_is_told_while_images_are_read(tmp_path: Path) -> None:
    seen: list[tuple[int, int]] = []
    prepare_images(image_job("unused", colour_rows(tmp_path, 3)), None, progress=lambda *a: seen.append(a))
    assert seen and seen[-1] == (3, 3)


def test_the_prepared_dataset_keeps_where_images_are_not_their_pixels(tmp_path: Path) -> None:
    """A dataset of photos is prepared holding one photo at a time: the rows keep each image's path (or its bytes,
    for an image given in the row) and decode it when read."""
    big = (400, 300)
    rows = []
    for i in range(6):
        write_picture(tmp_path / f"{i}.png", (40 * i, 0, 0), big)
        rows.append(chat([f"{i}.png"], answer=str(i)))
    data = prepare_images(image_job("unused", write_jsonl(tmp_path / "train.jsonl", rows)), None)
    assert data.train.data.nbytes < 6 * 1000  # paths and text, not 6 × 360 kB of pixels
    row = data.train[2]
    assert row["images"][0].size == big and row["images"][0].mode == "RGB"
    assert row["images"][0].getpixel((9, 9)) == (80, 0, 0)


def test_dedupe_removes_rows_repeating_text_and_image_content(tmp_path: Path) -> None:
    write_picture(tmp_path / "a.png", RED)
    write_picture(tmp_path / "copy-of-a.png", RED)  # the same bytes under another name: the same image
    write_picture(tmp_path / "b.png", BLUE)
    path = write_jsonl(tmp_path / "train.jsonl", [chat(["a.png"]), chat(["copy-of-a.png"]), chat(["b.png"]),
                                                  chat(["a.png"], answer="another answer")])
    data = prepare_images(image_job("unused", path, dedupe="exact"), None)
    assert (len(data.train), data.deduplicated) == (3, 1)
    assert [r["messages"][1]["content"][0]["text"] for r in data.train] == ["red", "red", "another answer"]


def test_an_eval_file_of_images_is_prepared_and_named_by_place(tmp_path: Path) -> None:
    train = colour_rows(tmp_path, 3)
    evals = colour_rows(tmp_path, 2, name="eval.jsonl")
    data = prepare_images(image_job("unused", train, eval_split=str(evals), eval_steps=1), None)
    assert data.eval is not None and len(data.eval) == 2
    assert data.eval_places == [{"file": str(evals), "line": 1}, {"file": str(evals), "line": 2}]
    assert data.eval_examples is not None and data.eval_examples[0]["images"][0].mode == "RGB"
