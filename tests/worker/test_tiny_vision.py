"""The bundled pictures (worker/tiny_images.py), the tiny vision models' processors (worker/tiny_vision.py) and the
processors without torchvision (worker/modalities/vision_compat.py)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tunestudio.worker.tiny_images import COLOURS, EVAL_ROWS, TRAIN_ROWS, write_image_datasets

REPO = Path(__file__).resolve().parents[2]


def test_the_bundled_pictures_ask_colours_and_no_held_out_picture_is_a_training_one(tmp_path: Path) -> None:
    train, held = write_image_datasets(tmp_path)
    rows = {p.name: [json.loads(line) for line in p.read_text().splitlines()] for p in (train, held)}
    assert len(rows["shapes.jsonl"]) == TRAIN_ROWS and len(rows["shapes_eval.jsonl"]) == EVAL_ROWS

    def pictures(name: str) -> set[str]:
        return {hashlib.sha256((tmp_path / r["images"][0]).read_bytes()).hexdigest() for r in rows[name]}

    assert not pictures("shapes.jsonl") & pictures("shapes_eval.jsonl")
    answers = {r["messages"][1]["content"][0]["text"] for name in rows for r in rows[name]}
    assert answers == set(COLOURS)  # every held-out answer trains; the picture decides which
    again = tmp_path / "again"
    write_image_datasets(again)  # the same seed, the same pictures
    assert (again / "shapes" / "eval-0000.png").read_bytes() == (tmp_path / "shapes" / "eval-0000.png").read_bytes()


@pytest.mark.parametrize("family", ["smolvlm", "qwen2-vl"])
def test_a_processor_saves_and_loads_without_torchvision(family: str, tmp_path: Path) -> None:
    from transformers import AutoProcessor

    from tunestudio.worker.modalities import allow_missing_video, torchvision_available

    folder = REPO / "models" / f"tiny-{family}"
    assert (folder / "model.safetensors").is_file(), f"{folder} is not built: `make test` builds it"
    allow_missing_video()
    processor = AutoProcessor.from_pretrained(folder)
    processor.save_pretrained(tmp_path)
    again = AutoProcessor.from_pretrained(tmp_path)
    assert type(again) is type(processor) and again.chat_template == processor.chat_template
    if not torchvision_available():  # SmolVLM's video processor imports without torchvision; Qwen2-VL's does not
        assert (again.video_processor is None) is (family == "qwen2-vl")
    ids = again(text=["hello"], return_tensors="pt")["input_ids"]
    assert ids.shape[0] == 1
    # SmolVLM's chat template reads its video processor's frame settings: a job folder's processor (no config.json
    # beside it) must still find one
    text = again.apply_chat_template([[{"role": "user", "content": "hi"}]], add_generation_prompt=True)
    assert "hi" in text[0]
