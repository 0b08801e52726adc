"""An image model's chat prompt: the request's images decoded, and its processor's chat template applied.

An image job's model answers through its processor (`AutoProcessor`: the tokenizer, the chat template and the image
processor together), which the chat worker loaded for it (the image modality's `serving_loaders`). The parent sent
each image as its bytes (`ImageInput`, in the order of the turns' `{"type": "image"}` parts); here Pillow decodes
them (its decompression-bomb limit an error, the whole file read so a truncated one is found), each placeholder gets
its picture, and the processor turns the turns into the prompt's token ids (each image's tokens expanded) and the
model's other inputs: `pixel_values` and what the family adds (Idefics3's `pixel_attention_mask`, Qwen2-VL's
`image_grid_thw`). A turn's text content becomes a text part, as vision templates read content as a list of parts.

Loaded only for an image model's requests: a text model's chat never imports this module.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Sequence
from typing import Any

from tunestudio.inference_protocol import ImageInput
from tunestudio.worker.errors import UserFacing


def decode(image: ImageInput) -> Any:
    """The image as an RGB picture, turned upright by its EXIF orientation; UserFacing (400, naming where the
    request put it) if Pillow cannot read it whole or it is past Pillow's decompression-bomb limit."""
    from PIL import Image, ImageOps

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            picture = Image.open(io.BytesIO(image.data))
            picture.load()  # every byte: a truncated file fails here, not inside the processor
            # upright as a viewer shows it (a phone's photo is stored turned, its turn in EXIF), as the job's rows
            # were read for training (worker/data/images.py)
            return ImageOps.exif_transpose(picture).convert("RGB")
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as exc:
        raise UserFacing(f"{image.where}: the image is too large to decode safely ({exc})", 400, "invalid_image",
                         param=image.where) from None
    except (OSError, SyntaxError, ValueError) as exc:  # UnidentifiedImageError is an OSError
        raise UserFacing(f"{image.where}: the image cannot be read: {exc}", 400, "invalid_image",
                         param=image.where) from None


def with_pictures(messages: list[dict[str, Any]], pictures: Sequence[Any]) -> list[dict[str, Any]]:
    """The turns as a processor's template reads them: content a list of parts, each image placeholder holding its
    picture (in order). UserFacing when placeholders and pictures disagree in number."""
    remaining = list(pictures)
    turns = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                if part.get("type") == "image":
                    if not remaining:
                        raise UserFacing("messages: more image parts than images were sent", 400, "invalid_image")
                    part = {"type": "image", "image": remaining.pop(0)}
                parts.append(part)
        else:
            parts = [{"type": "text", "text": content or ""}]
        turns.append({**message, "content": parts})
    if remaining:
        raise UserFacing("messages: more images were sent than the turns have image parts", 400, "invalid_image")
    return turns


def processor_prompt(processor: Any, messages: list[dict[str, Any]], images: Sequence[ImageInput],
                     tools: list[dict[str, Any]] | None) -> tuple[list[int], dict[str, Any]]:
    """The prompt's token ids and the model's other inputs (tensors: pixel values and the family's own), the
    processor's chat template applied with a generation prompt. UserFacing (400) for an unreadable image or a
    conversation the template refuses."""
    if not processor.chat_template:
        raise UserFacing("messages: the model's processor has no chat template, so it cannot read a conversation",
                         400, "invalid_messages")
    turns = with_pictures(messages, [decode(image) for image in images])
    try:
        encoded = processor.apply_chat_template([turns], tools=tools, add_generation_prompt=True, tokenize=True,
                                                return_dict=True, return_tensors="pt")
    except Exception as exc:  # jinja's and the image processor's own errors, for what they refuse
        raise UserFacing(f"messages: the model's processor refuses this conversation: {exc}", 400,
                         "invalid_messages") from None
    ids = encoded.pop("input_ids")[0].tolist()
    encoded.pop("attention_mask", None)  # generate gets one of its own, over the whole prompt
    return ids, dict(encoded)
