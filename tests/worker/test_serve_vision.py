"""worker/serve/vision.py through the chat worker's recipes (no process): an image model answers a chat request
with its images exactly as `generate` on the processor's inputs does, for both tiny families; a picture Pillow
cannot read, or one sent to a text model, is a 400 naming where the request put it."""

from __future__ import annotations

import io
import queue
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from tunestudio.inference_protocol import Delta, Done, Generate, ImageInput, ModelSpec, Render, Rendered, Started
from tunestudio.worker.errors import UserFacing
from tunestudio.worker.serve.generation import Models, answer, render

from ..helpers.vision import FAMILIES, PICTURE, QUESTION

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")]  # peft's
ASK = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
WHERE = "messages[0].content[0]"


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def folder(request: pytest.FixtureRequest) -> Path:
    folder = FAMILIES[request.param]
    assert (folder / "model.safetensors").is_file(), f"{folder} is not built: `make test` builds it"
    return folder


@pytest.fixture(scope="module")
def models() -> Models:
    return Models(queue.Queue())


def spec(folder: Path, modality: str = "image") -> ModelSpec:
    return ModelSpec(job_id="j", base=True, base_model=str(folder), weights=str(folder), kind="full",
                     tokenizer=str(folder), modality=modality)


def replies(recipe: Any, models: Models, request: Any) -> list[Any]:
    out: queue.Queue[Any] = queue.Queue()
    recipe(models, request, out, threading.Event())
    return [out.get() for _ in range(out.qsize())]


def ask(folder: Path, images: tuple[ImageInput, ...], messages: list[dict[str, Any]] = ASK) -> Generate:
    return Generate(1, spec(folder), messages, {"max_tokens": 6, "min_tokens": 6, "temperature": 0}, 1, None,
                    images)


def png_bytes() -> bytes:
    return PICTURE.read_bytes()


def reference(folder: Path, messages: list[dict[str, Any]], max_new: int, model: Any = None) -> list[int]:
    """The tokens `generate` makes (the folder's model, or `model`) from the processor's own inputs for the same
    turns and picture."""
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from tunestudio.worker.modalities.vision_compat import allow_missing_video

    allow_missing_video()
    processor = AutoProcessor.from_pretrained(folder)
    model = model or AutoModelForImageTextToText.from_pretrained(folder).eval()
    picture = Image.open(PICTURE).convert("RGB")
    turns = [{**m, "content": [{"type": "image", "image": picture} if p["type"] == "image" else p
                               for p in m["content"]]} for m in messages]
    inputs = processor.apply_chat_template([turns], add_generation_prompt=True, tokenize=True, return_dict=True,
                                           return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=max_new, min_new_tokens=max_new, do_sample=False)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def test_an_image_model_answers_with_its_picture_as_generate_does(folder: Path, models: Models) -> None:
    got = replies(answer, models, ask(folder, (ImageInput(WHERE, png_bytes()),)))
    started, done = next(r for r in got if isinstance(r, Started)), got[-1]
    assert isinstance(done, Done) and done.completion_tokens == 6
    text = "".join(r.text for r in got if isinstance(r, Delta))
    _, tokenizer, _ = models.for_spec(spec(folder))
    assert text == tokenizer.tokenizer.decode(reference(folder, ASK, 6), skip_special_tokens=True)
    # the same words without the picture: fewer prompt tokens (the image's are gone)
    plain = replies(answer, models, ask(folder, (), [{"role": "user", "content": QUESTION}]))
    assert next(r for r in plain if isinstance(r, Started)).prompt_tokens < started.prompt_tokens


def test_the_prompt_shown_holds_the_image_s_tokens(folder: Path, models: Models) -> None:
    got = replies(render, models, Render(1, spec(folder), ASK, None, (ImageInput(WHERE, png_bytes()),)))
    shown = next(r for r in got if isinstance(r, Rendered))
    assert ("<image>" in shown.prompt or "<|image_pad|>" in shown.prompt) and "What colour" in shown.prompt


def test_a_photo_is_read_upright_by_its_exif_orientation_as_in_training() -> None:
    from PIL import Image

    from tunestudio.worker.serve.vision import decode

    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 degrees clockwise to show
    buffer = io.BytesIO()
    Image.new("RGB", (20, 10), (255, 0, 0)).save(buffer, "JPEG", exif=exif.tobytes())
    assert decode(ImageInput(WHERE, buffer.getvalue())).size == (10, 20)


def _truncated() -> bytes:
    return png_bytes()[:200]


def _bomb() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("1", (12_000, 12_000)).save(buffer, "PNG")  # 144M pixels: past Pillow's 89M warning limit
    return buffer.getvalue()


@pytest.mark.parametrize(("data", "said"), [(b"plain text, no picture", "cannot be read"),
                                            (None, "cannot be read"), ("bomb", "too large to decode")])
def test_an_unreadable_picture_is_a_400_naming_its_part(data: Any, said: str, models: Models) -> None:
    raw = _truncated() if data is None else _bomb() if data == "bomb" else data
    with pytest.raises(UserFacing, match=said) as caught:
        replies(answer, models, ask(FAMILIES["qwen2_vl"], (ImageInput(WHERE, raw),)))
    assert caught.value.status == 400 and caught.value.code == "invalid_image"
    assert caught.value.extra == {"param": WHERE} and str(caught.value).startswith(WHERE)


def test_placeholders_and_pictures_must_agree(models: Models) -> None:
    picture = ImageInput(WHERE, png_bytes())
    with pytest.raises(UserFacing, match="more images were sent"):
        replies(answer, models, ask(FAMILIES["qwen2_vl"], (picture, picture)))
    with pytest.raises(UserFacing, match="more image parts"):
        replies(answer, models, ask(FAMILIES["qwen2_vl"], ()))


def test_a_text_model_refuses_a_picture(tiny_model: Path, models: Models) -> None:
    request = Generate(1, spec(tiny_model, "text"), [{"role": "user", "content": "hi"}], {"max_tokens": 2}, 1, None,
                       (ImageInput(WHERE, png_bytes()),))
    with pytest.raises(UserFacing, match="reads no images") as caught:
        replies(answer, models, request)
    assert caught.value.code == "image_not_supported"


def test_an_image_job_s_adapter_answers_as_its_peft_model(tmp_path: Path) -> None:
    """A LoRA job on the vision tower and the language model: served merged (serve/serving.py), as peft answers."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    folder = FAMILIES["qwen2_vl"]
    torch.manual_seed(0)
    peft_model = get_peft_model(AutoModelForImageTextToText.from_pretrained(folder).eval(),
                                LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 1.0)  # large enough that greedy answers differ from the base's
    peft_model.save_pretrained(tmp_path / "job")
    adapter = ModelSpec(job_id="j", base=False, base_model=str(folder), weights=str(tmp_path / "job"),
                        kind="adapter", tokenizer=str(folder), modality="image")
    request = Generate(1, adapter, ASK, {"max_tokens": 6, "min_tokens": 6, "temperature": 0}, 1, None,
                       (ImageInput(WHERE, png_bytes()),))
    models = Models(queue.Queue())
    text = "".join(r.text for r in replies(answer, models, request) if isinstance(r, Delta))
    _, processor, _ = models.for_spec(adapter)
    assert text == processor.tokenizer.decode(reference(folder, ASK, 6, peft_model.eval()), skip_special_tokens=True)
    base = "".join(r.text for r in replies(answer, models, ask(folder, (ImageInput(WHERE, png_bytes()),)))
                   if isinstance(r, Delta))
    assert base == processor.tokenizer.decode(reference(folder, ASK, 6), skip_special_tokens=True) != text
