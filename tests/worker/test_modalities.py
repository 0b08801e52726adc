"""Kinds of data (worker/modalities/): the config names a job's modality, the worker's object of that name runs it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from tunestudio.config.vocabulary import TRAINED_MODALITIES
from tunestudio.worker import modalities
from tunestudio.worker.modalities.text import TextModality

from ..helpers.jobs import job_config


def test_the_config_and_the_worker_name_the_same_modalities(tiny_model: Path, tmp_path: Path) -> None:
    assert tuple(modalities.MODALITIES) == TRAINED_MODALITIES == ("text", "image", "audio")
    cfg = job_config(tiny_model, tmp_path / "out")
    assert cfg.modality == "text" and isinstance(modalities.for_job(cfg), TextModality)
    with pytest.raises(KeyError, match="video data has no implementation in this worker"):
        modalities.named("video")


def test_a_method_that_trains_no_audio_is_refused_at_submit(tiny_model: Path, tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="method: dpo trains text or image data, not audio data"):
        job_config(tiny_model, tmp_path / "out", is_dataset_audio=True, method="dpo")


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # peft's own call
def test_the_recipe_asks_the_jobs_modality(tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job runs through its modality object: each of the recipe's data-dependent steps is its call."""
    from tunestudio.events import Completed, parse_event
    from tunestudio.worker import main

    from ..helpers.channel import ListChannel

    asked: list[str] = []

    class Recording(TextModality):
        def __getattribute__(self, name: str) -> Any:
            if name in ("load_processor", "load_model", "prepare_data", "generate", "evaluator"):
                asked.append(name)
            return super().__getattribute__(name)

    monkeypatch.setitem(modalities.MODALITIES, "text", Recording())
    cfg = job_config(tiny_model, tmp_path / "out", max_steps=2, eval_steps=2, eval_generate_rows=2,
                     sample_prompts=["What is the opposite of hot?"], precision="fp32")
    channel = ListChannel()
    assert main.run(cfg, channel) == 0, channel.lines[-3:]
    done = parse_event(channel.lines[-1])
    assert isinstance(done, Completed) and done.evaluation is not None and len(done.samples) == 1
    assert asked[:4] == ["load_processor", "load_model", "prepare_data", "generate"]
    assert "evaluator" in asked and asked.count("generate") == 2  # the sample, before and after


def test_images_in_a_hub_dataset_make_an_image_job(tmp_path: Path) -> None:
    """A dataset saved by `datasets` with an Image feature (the hub's layout) is detected as images, like a file."""
    from datasets import Dataset, Features, Image, List, Value
    from PIL import Image as Picture

    picture = tmp_path / "red.png"
    Picture.new("RGB", (8, 8), "red").save(picture)
    turns = [{"role": "user", "content": "What colour?"}, {"role": "assistant", "content": "red"}]
    features = Features({"images": List(Image()), "messages": List({"role": Value("string"),
                                                                      "content": Value("string")})})
    Dataset.from_list([{"images": [str(picture)], "messages": turns}] * 4, features=features).save_to_disk(
        str(tmp_path / "saved"))
    cfg = job_config("models/tiny-smolvlm", tmp_path / "out", local_datasets=[], hf_dataset=str(tmp_path / "saved"))
    found, note = modalities.detected(cfg)
    assert found.modality == "image" and note is not None and "auto-detected" in note
    text, none = modalities.detected(job_config("models/tiny-smolvlm", tmp_path / "out"))  # the bundled alpaca rows
    assert text.modality == "text" and none is None
