"""Image rows: read in any of three layouts, each image opened and checked, as TRL's vision collator takes them.

Layouts (auto-detected per row, like the text formats):
- Hugging Face / TRL: an `images` column (or `image`) of paths, bytes or the hub's {"bytes", "path"} records, and
  `messages` whose turns hold {"type": "image"} placeholders, one per image, in order (turns of plain text get
  them before the first user turn's text, where TRL's collator puts them);
- OpenAI's vision fine-tuning: `messages` with {"type": "image_url", "image_url": {"url": ...}} parts (a data: URL,
  a file path or a file:// URL); image parts that hold their image ({"type": "image", "image" or "url" or
  "path": ...}, as transformers' chat templates take them) are read alike. A row names its images in its column
  or in its messages, not both;
- a folder of images with a captions file (CSV or JSONL; what an image folder's `metadata.csv` holds): a
  `file_name` column and a `caption` (or `text`), or a `question` and an `answer`; the hub's captioning layout
  (an `image` column beside a `caption` or `text`) reads alike.

Every row becomes {"messages": [...], "images": [PIL.Image, ...]} with its images' placeholders as {"type":
"image"} parts. A path is read relative to the data file's folder and must lie inside it (a row cannot reach the
rest of the machine); http(s) URLs are refused (the studio fetches nothing). Pillow's decompression-bomb limit is
an error here, not a warning, and every image is decoded in full, so a truncated file is found before training;
a photo is turned upright by its EXIF orientation, as `datasets` and transformers read it.
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
    if any(data.get(c) not in (None, []) for c in _COLUMNS):
        return True
    if "file_name" in data:  # a captions file's row, unless it names a recording (an audio dataset's)
        from tunestudio.worker.data.audio import is_audio_row

        return not is_audio_row(data)
    messages = data.get("messages")
    return isinstance(messages, list) and any(
        {"image_url", "image"} & set(_parts(m)) for m in messages if isinstance(m, dict))


def _parts(message: dict[str, Any]) -> list[str]:
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [p["type"] for p in content if isinstance(p, dict) and isinstance(p.get("type"), str)]


@dataclass(frozen=True)
class ImageRef:
    """An image as a row names it, and what it was read from (for the report and the errors)."""

    image: Any  # PIL.Image.Image, decoded and converted to RGB
    label: str  # the path, "data: URL", "bytes"
    digest: str  # sha256 of the encoded bytes: duplicates by content
    format: str | None
    size: tuple[int, int]
    path: str | None = None  # the file it was read from (resolved), when it is one
    raw: bytes | None = None  # else its encoded bytes (None: it came decoded)

    @property
    def stored(self) -> dict[str, Any]:
        """The image as `datasets`' Image feature keeps it: the file's path, else its bytes (a decoded image as PNG),
        so a prepared dataset holds where each image is, not its pixels, and decodes it when a batch needs it."""
        if self.path is not None:
            return {"bytes": None, "path": self.path}
        if self.raw is not None:
            return {"bytes": self.raw, "path": None}
        out = io.BytesIO()
        self.image.save(out, "PNG")
        return {"bytes": out.getvalue(), "path": None}


def to_example(row: Row) -> dict[str, Any]:
    """The row as {"messages", "images"} (PIL images), or RowProblem naming what is wrong."""
    example, _ = read_row(row)
    return example


@dataclass(frozen=True)
class Planned:
    """A row's conversation (placeholders in place, every turn a list of parts) and the images it names, not yet
    opened: what `read_row` checks before it opens them, and the report opens one at a time."""

    messages: list[dict[str, Any]]
    sources: list[Any]  # paths, data: URLs, bytes, hub records, decoded images: what `open_image` takes
    base: Path  # the data file's folder: paths are read inside it


def read_row(row: Row) -> tuple[dict[str, Any], list[ImageRef]]:
    """The row as {"messages", "images"} (PIL images) and its images' refs; RowProblem naming what is wrong."""
    planned = plan(row)
    refs = [open_image(source, planned.base, f"image {i + 1}") for i, source in enumerate(planned.sources)]
    return {"messages": planned.messages, "images": [r.image for r in refs]}, refs


def plan(row: Row) -> Planned:
    """The row's layout read and its placeholders checked against its images (RowProblem), no image opened."""
    data = row.data
    if data is None:
        raise RowProblem(row.problem or "cannot be read")
    base = Path(row.source).parent
    if "messages" in data:
        messages, sources = _messages(data)
    elif "file_name" in data or _column(data) is not None:  # a captions file, or the hub's image + caption
        messages, sources = _caption_messages(data), _column(data) or [data["file_name"]]
    else:
        raise RowProblem("has images but no `messages` (or `file_name` with a caption)")
    placeholders = sum(_parts(m).count("image") for m in messages)
    if not placeholders and sources and all(isinstance(m.get("content"), str | None) for m in messages):
        messages = _images_first(messages, len(sources))
        placeholders = len(sources)
    if placeholders != len(sources):
        raise RowProblem(f"has {len(sources)} image(s) but {placeholders} image placeholder(s) in its messages "
                         "({\"type\": \"image\"} parts); they must match one for one")
    if not sources:
        raise RowProblem("has no image (is_dataset_image: every row needs at least one)")
    if len(sources) > MAX_IMAGES_PER_ROW:
        raise RowProblem(f"has {len(sources)} images, more than the {MAX_IMAGES_PER_ROW} a row may hold")
    return Planned([_as_parts(m) for m in messages], sources, base)


def _as_parts(message: dict[str, Any]) -> dict[str, Any]:
    """A turn whose content is text as one text part: every turn's content a list of parts, as TRL's collator makes
    them, so that a dataset's column has one type (Arrow cannot mix text and lists)."""
    if isinstance(message.get("content"), str):
        return {**message, "content": [{"type": "text", "text": message["content"]}]}
    return message


def _column(data: dict[str, Any]) -> list[Any] | None:
    """The images of the row's `images` (or `image`) column, or None without one."""
    column = next((data[c] for c in _COLUMNS if data.get(c) not in (None, [])), None)
    return None if column is None else list(column) if isinstance(column, list) else [column]


def _images_first(messages: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """Turns of plain text with images beside them: the placeholders go before the first user turn's text, where
    TRL's vision collator puts them (trl.data_utils.prepare_multimodal_messages)."""
    out, placed = [], False
    for message in messages:
        if message["role"] == "user" and not placed:
            text = [{"type": "text", "text": message["content"]}] if message.get("content") else []
            message = {**message, "content": [*[{"type": "image"}] * n, *text]}
            placed = True
        out.append(message)
    return out


def _caption_messages(data: dict[str, Any]) -> list[dict[str, Any]]:
    question = data.get("question") or data.get("prompt") or CAPTION_PROMPT
    answer = data.get("answer") if data.get("answer") is not None else data.get("caption", data.get("text"))
    if not isinstance(answer, str) or not answer.strip():
        raise RowProblem("has a file_name but no caption (a `caption` or `text` column, or `question` and `answer`)")
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": str(question)}]},
            {"role": "assistant", "content": [{"type": "text", "text": answer}]}]


def _messages(data: dict[str, Any]) -> tuple[list[dict[str, Any]], list[Any]]:
    """The messages with their images' parts turned into placeholders, and the images in order: the column's, or
    those the messages hold (image_url parts; image parts with their image, as transformers' templates take)."""
    column = _column(data)
    messages = data["messages"]
    if not isinstance(messages, list) or not messages:
        raise RowProblem("`messages` must be a non-empty list of turns")
    out, held = [], []
    for n, message in enumerate(messages, 1):
        if not isinstance(message, dict) or "role" not in message:
            raise RowProblem(f"message {n} needs a role")
        content = message.get("content")
        if isinstance(content, list):
            content = _content(n, content, held)
        elif content is not None and not isinstance(content, str):
            raise RowProblem(f"message {n}: content must be text or a list of parts")
        out.append({"role": message["role"], "content": content})
    if column is not None and held:  # which placeholder is whose would be a guess
        raise RowProblem("names images both in its `images` column and in its messages (image_url parts or image "
                         "parts holding an image); name them in one place")
    return out, column if column is not None else held


def _content(n: int, content: list[Any], held: list[Any]) -> list[dict[str, Any]]:
    """A turn's parts as placeholders and text; the images the parts hold are appended to `held`, in order."""
    parts = []
    for part in content:
        if not isinstance(part, dict) or "type" not in part:
            raise RowProblem(f"message {n} has a content part without a type")
        if part["type"] == "image_url":
            url = part.get("image_url")
            held.append(url.get("url") if isinstance(url, dict) else url)
            parts.append({"type": "image"})
        elif part["type"] == "image":
            # Arrow gives every part every key, so a placeholder read from Parquet has "image": None and the like
            inline = next((part[k] for k in ("image", "url", "path") if part.get(k) is not None), None)
            if inline is not None:
                held.append(inline)
            parts.append({"type": "image"})
        elif part["type"] == "text":
            parts.append({"type": "text", "text": str(part.get("text") or "")})
        else:
            raise RowProblem(f"message {n} has a content part of type {part['type']!r} (text, image and "
                             "image_url are read)")
    return parts


def open_image(source: Any, base: Path, what: str) -> ImageRef:
    """One image from a path, a data: URL, bytes or a hub record, decoded and checked; RowProblem if unusable."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(source, Image.Image):
        return _ref(source, "decoded", hashlib.sha256(source.tobytes()).hexdigest())
    raw, label, path = _bytes(source, base, what)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(raw))
            image.load()  # the whole file: a truncated one fails here, not in the middle of training
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as exc:
        raise RowProblem(f"{what} ({label}) is too large to decode safely: {exc}") from None
    except UnidentifiedImageError:  # its own words name an in-memory buffer by address
        raise RowProblem(f"{what} ({label}) is not a readable image: no picture format Pillow reads") from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise RowProblem(f"{what} ({label}) is not a readable image: {exc}") from None
    return _ref(image, label, hashlib.sha256(raw).hexdigest(), path, None if path else raw)


def _ref(image: Any, label: str, digest: str, path: str | None = None, raw: bytes | None = None) -> ImageRef:
    from PIL import ImageOps

    fmt = image.format
    # upright as a viewer shows it (a phone's photo is stored turned, with its turn in EXIF), as `datasets` and
    # transformers' load_image read it: the model sees the same picture in training and in chat
    image = ImageOps.exif_transpose(image)
    return ImageRef(image=image.convert("RGB"), label=label, digest=digest, format=fmt, size=image.size, path=path,
                    raw=raw)


def _bytes(source: Any, base: Path, what: str) -> tuple[bytes, str, str | None]:
    """(the image's encoded bytes, what to call it, the file's resolved path when it is one)."""
    if isinstance(source, dict):  # the hub's Image feature, as Parquet keeps it
        if source.get("bytes"):
            return bytes(source["bytes"]), "bytes", None
        source = source.get("path") or source.get("url")
    if isinstance(source, (bytes, bytearray)):
        return bytes(source), "bytes", None
    if not isinstance(source, str) or not source:
        raise RowProblem(f"{what} is not a path, a data: URL or image bytes")
    if source.startswith("data:"):
        head, _, payload = source.partition(",")
        if ";base64" not in head:
            raise RowProblem(f"{what}: a data: URL must be base64-encoded")
        try:
            return base64.b64decode(payload, validate=True), "data: URL", None
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
        return full.read_bytes(), source, str(full)
    except OSError as exc:
        raise RowProblem(f"{what} ({source}) cannot be read: {exc.strerror or exc}") from None
