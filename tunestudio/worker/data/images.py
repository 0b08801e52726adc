"""Image rows: read in any of three layouts, each image opened and checked, as TRL's vision collator takes them.

Layouts (auto-detected per row, like the text formats):
- Hugging Face / TRL: an `images` column (or `image`) of paths, bytes or the hub's {"bytes", "path"} records, and
  `messages` whose turns hold {"type": "image"} placeholders, one per image, in order;
- OpenAI's vision fine-tuning: `messages` with {"type": "image_url", "image_url": {"url": ...}} parts (a data: URL,
  a file path or a file:// URL);
- a folder of images with a captions file (CSV or JSONL; what an image folder's `metadata.csv` holds): a
  `file_name` column and a `caption` (or `text`), or a `question` and an `answer`.

Every row becomes {"messages": [...], "images": [PIL.Image, ...]} with its images' placeholders as {"type":
"image"} parts. A path is read relative to the data file's folder and must lie inside it (a row cannot reach the
rest of the machine); http(s) URLs are refused (the studio fetches nothing). Pillow's decompression-bomb limit is
an error here, not a warning, and every image is decoded in full, so a truncated file is found before training.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunestudio.worker.data.formats import RowProblem
from tunestudio.worker.data.rows import Row

MAX_IMAGES_PER_ROW = 8
CAPTION_PROMPT = "Describe the image."
_COLUMNS = ("images", "image")


def is_image_row(data: dict[str, Any] | None) -> bool:
    """Whether a row holds images in one of the layouts (the modality's detection reads the first rows)."""
    if not isinstance(data, dict):
        return False
    if any(data.get(c) not in (None, []) for c in _COLUMNS) or "file_name" in data:
        return True
    return any(_parts(m).count("image_url") for m in data.get("messages") or [] if isinstance(m, dict))


def _parts(message: dict[str, Any]) -> list[str]:
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [p.get("type") for p in content if isinstance(p, dict)]


@dataclass(frozen=True)
class ImageRef:
    """An image as a row names it, and what it was read from (for the report and the errors)."""

    image: Any  # PIL.Image.Image, decoded and converted to RGB
    label: str  # the path, "data: URL", "bytes"
    digest: str  # sha256 of the encoded bytes: duplicates by content
    format: str | None
    size: tuple[int, int]


def to_example(row: Row) -> dict[str, Any]:
    """The row as {"messages", "images"} (PIL images), or RowProblem naming what is wrong."""
    example, _ = read_row(row)
    return example


def read_row(row: Row) -> tuple[dict[str, Any], list[ImageRef]]:
    data = row.data
    if data is None:
        raise RowProblem(row.problem or "cannot be read")
    base = Path(row.source).parent
    if "file_name" in data and "messages" not in data:
        messages, sources = _caption_messages(data), [data["file_name"]]
    elif "messages" in data:
        messages, sources = _messages(data)
    else:
        raise RowProblem("has images but no `messages` (or `file_name` with a caption)")
    placeholders = sum(_parts(m).count("image") for m in messages)
    if placeholders != len(sources):
        raise RowProblem(f"has {len(sources)} image(s) but {placeholders} image placeholder(s) in its messages "
                         "({\"type\": \"image\"} parts); they must match one for one")
    if not sources:
        raise RowProblem("has no image (is_dataset_image: every row needs at least one)")
    if len(sources) > MAX_IMAGES_PER_ROW:
        raise RowProblem(f"has {len(sources)} images, more than the {MAX_IMAGES_PER_ROW} a row may hold")
    refs = [open_image(source, base, f"image {i + 1}") for i, source in enumerate(sources)]
    return {"messages": messages, "images": [r.image for r in refs]}, refs


def _caption_messages(data: dict[str, Any]) -> list[dict[str, Any]]:
    question = data.get("question") or data.get("prompt") or CAPTION_PROMPT
    answer = data.get("answer") if data.get("answer") is not None else data.get("caption", data.get("text"))
    if not isinstance(answer, str) or not answer.strip():
        raise RowProblem("has a file_name but no caption (a `caption` or `text` column, or `question` and `answer`)")
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": str(question)}]},
            {"role": "assistant", "content": [{"type": "text", "text": answer}]}]


def _messages(data: dict[str, Any]) -> tuple[list[dict[str, Any]], list[Any]]:
    """The messages with image_url parts turned into placeholders, and the images in order (a column's first)."""
    column = next((data[c] for c in _COLUMNS if data.get(c) not in (None, [])), None)
    sources: list[Any] = [] if column is None else list(column) if isinstance(column, list) else [column]
    messages = data["messages"]
    if not isinstance(messages, list) or not messages:
        raise RowProblem("`messages` must be a non-empty list of turns")
    out = []
    for n, message in enumerate(messages, 1):
        if not isinstance(message, dict) or "role" not in message:
            raise RowProblem(f"message {n} needs a role")
        content = message.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                if not isinstance(part, dict) or "type" not in part:
                    raise RowProblem(f"message {n} has a content part without a type")
                if part["type"] == "image_url":
                    url = part.get("image_url")
                    sources.append(url.get("url") if isinstance(url, dict) else url)
                    parts.append({"type": "image"})
                elif part["type"] == "image":
                    parts.append({"type": "image"})
                elif part["type"] == "text":
                    parts.append({"type": "text", "text": str(part.get("text", ""))})
                else:
                    raise RowProblem(f"message {n} has a content part of type {part['type']!r} (text, image and "
                                     "image_url are read)")
            content = parts
        elif content is not None and not isinstance(content, str):
            raise RowProblem(f"message {n}: content must be text or a list of parts")
        out.append({"role": message["role"], "content": content})
    return out, sources


def open_image(source: Any, base: Path, what: str) -> ImageRef:
    """One image from a path, a data: URL, bytes or a hub record, decoded and checked; RowProblem if unusable."""
    from PIL import Image

    if isinstance(source, Image.Image):
        return _ref(source, "decoded", hashlib.sha256(source.tobytes()).hexdigest())
    raw, label = _bytes(source, base, what)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(raw))
            image.load()  # the whole file: a truncated one fails here, not in the middle of training
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as exc:
        raise RowProblem(f"{what} ({label}) is too large to decode safely: {exc}") from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise RowProblem(f"{what} ({label}) is not a readable image: {exc}") from None
    return _ref(image, label, hashlib.sha256(raw).hexdigest())


def _ref(image: Any, label: str, digest: str) -> ImageRef:
    fmt, size = image.format, image.size
    return ImageRef(image=image.convert("RGB"), label=label, digest=digest, format=fmt, size=size)


def _bytes(source: Any, base: Path, what: str) -> tuple[bytes, str]:
    if isinstance(source, dict):  # the hub's Image feature, as Parquet keeps it
        if source.get("bytes"):
            return bytes(source["bytes"]), "bytes"
        source = source.get("path") or source.get("url")
    if isinstance(source, (bytes, bytearray)):
        return bytes(source), "bytes"
    if not isinstance(source, str) or not source:
        raise RowProblem(f"{what} is not a path, a data: URL or image bytes")
    if source.startswith("data:"):
        head, _, payload = source.partition(",")
        if ";base64" not in head:
            raise RowProblem(f"{what}: a data: URL must be base64-encoded")
        try:
            return base64.b64decode(payload, validate=True), "data: URL"
        except (binascii.Error, ValueError):
            raise RowProblem(f"{what}: the data: URL's base64 is not valid") from None
    if source.startswith(("http://", "https://")):
        raise RowProblem(f"{what} is a web address ({source[:80]}); the studio fetches nothing: download it and "
                         "name the file")
    path = Path(source.removeprefix("file://")).expanduser()
    full = (path if path.is_absolute() else base / path).resolve()
    if not full.is_relative_to(base.resolve()):
        raise RowProblem(f"{what} ({source}) lies outside the data file's folder {base}; images must be inside it")
    try:
        return full.read_bytes(), source
    except OSError as exc:
        raise RowProblem(f"{what} ({source}) cannot be read: {exc.strerror or exc}") from None
