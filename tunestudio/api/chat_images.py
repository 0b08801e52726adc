"""A chat request's images (OpenAI's `image_url` parts), read into bytes for the inference worker, which decodes them.

Below the routes (routes/openai.py and routes/chat.py). An image is a `data:` URL (base64; its bytes decoded here,
cheaply, without looking inside them) or a file the server may read: a `file://` URL or an absolute path inside its
model or data folders (`Settings.roots`: model roots, dataset roots, the bundled datasets), checked on the resolved
path before the file is touched, so a refusal never tells whether an outside file exists. http(s) URLs are refused:
the server fetches nothing. Only an image job's model (`ModelSpec.modality` "image") takes images. Each refusal is
a 400 naming the part (`messages[0].content[1]`); Pillow reads the bytes in the worker, and an image it cannot read
is a 400 from there. A request without images costs one look at its turns.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import unquote, urlsplit

from tunestudio.api.errors import ApiError
from tunestudio.api.openai_chat import ChatMessage
from tunestudio.inference_protocol import ImageInput, ModelSpec
from tunestudio.paths import Roots, expand

MAX_IMAGES = 16  # per request
MAX_IMAGE_BYTES = 20_000_000  # per image, encoded (OpenAI's limit)
INVALID = "invalid_image"


def image_parts(messages: Sequence[ChatMessage]) -> list[tuple[str, str]]:
    """(where, url) of each image part of the turns, in order."""
    return [(f"messages[{i}].content[{j}]", part.image_url.url)
            for i, message in enumerate(messages) for j, part in message.images()]


async def request_images(messages: Sequence[ChatMessage], spec: ModelSpec, roots: Roots) -> tuple[ImageInput, ...]:
    """The request's images as the worker takes them (none: `()`, at once); ApiError (400) for an image part the
    model or the server cannot take, naming it."""
    parts = image_parts(messages)
    if not parts:
        return ()
    if spec.modality != "image":
        raise ApiError(400, "image_not_supported", f"{parts[0][0]}: model {spec.model_id!r} is a {spec.modality} "
                       "model and reads no images; send text only, or chat with an image job (is_dataset_image)",
                       field=parts[0][0])
    if len(parts) > MAX_IMAGES:
        raise ApiError(400, INVALID, f"messages: {len(parts)} images; a request may hold at most {MAX_IMAGES}",
                       field="messages")
    folders = (*roots.model_roots, *roots.dataset_roots, *roots.bundled)
    return tuple(await asyncio.to_thread(lambda: [read_image(where, url, folders) for where, url in parts]))


def read_image(where: str, url: str, folders: Sequence[Path]) -> ImageInput:
    """One image part's bytes (a data: URL decoded, a file read); ApiError (400) saying what is wrong with it."""
    scheme = url.split(":", 1)[0].lower() if ":" in url[:12] else ""
    if scheme == "data":
        return ImageInput(where, _data_url(where, url))
    if scheme in ("http", "https"):
        raise ApiError(400, "image_url_not_fetched", f"{where}: {url[:80]!r} is a web address, and the server fetches "
                       "nothing: send the image in the request as a data: URL (data:image/png;base64,...), or as a "
                       "file path inside the server's model or data folders", field=where)
    if scheme == "file":
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise ApiError(400, INVALID, f"{where}: a file:// URL must name a file on this machine "
                           "(file:///path/to/image.png)", field=where)
        raw = unquote(parts.path)
    elif scheme == "" and url.startswith(("/", "~")):
        raw = url
    else:
        raise ApiError(400, INVALID, f"{where}: an image is a data: URL (data:image/png;base64,...), a file:// URL "
                       "or an absolute file path; not " + repr(url[:80]), field=where)
    return ImageInput(where, _file(where, raw, folders))


def _data_url(where: str, url: str) -> bytes:
    head, comma, payload = url.partition(",")
    media, *options = head[len("data:"):].split(";")
    if not comma or "base64" not in (o.strip().lower() for o in options):
        raise ApiError(400, INVALID, f"{where}: a data: URL's image must be base64-encoded "
                       "(data:image/png;base64,...)", field=where)
    if media and not media.lower().startswith("image/"):
        raise ApiError(400, INVALID, f"{where}: the data: URL holds {media[:60]}, not an image", field=where)
    if len(payload) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise ApiError(400, INVALID, f"{where}: the image is over {MAX_IMAGE_BYTES:,} bytes", field=where)
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, INVALID, f"{where}: the data: URL's base64 is not valid", field=where) from None
    if not data:
        raise ApiError(400, INVALID, f"{where}: the data: URL holds no image (it is empty)", field=where)
    return data


def _file(where: str, raw: str, folders: Sequence[Path]) -> bytes:
    try:
        path = expand(raw).resolve(strict=False)
    except (OSError, ValueError, RuntimeError):
        raise ApiError(400, INVALID, f"{where}: {raw[:200]!r} is not a path this machine takes", field=where) \
            from None
    if not any(path.is_relative_to(folder) for folder in folders):
        raise ApiError(400, "path_not_allowed", f"{where}: {raw[:200]!r} lies outside the model and data folders "
                       "this server reads images from (its model roots, dataset roots and bundled data)",
                       field=where)
    try:
        if not path.is_file():  # a folder, or a pipe or device that a read would wait on
            raise ApiError(400, INVALID, f"{where}: {raw[:200]!r} is no file", field=where)
        with path.open("rb") as handle:
            data = handle.read(MAX_IMAGE_BYTES + 1)
    except (OSError, ValueError) as exc:  # a name too long for the filesystem, a file gone or unreadable
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ApiError(400, INVALID, f"{where}: the file {raw[:200]!r} cannot be read: {reason}", field=where) \
            from None
    if len(data) > MAX_IMAGE_BYTES:
        raise ApiError(400, INVALID, f"{where}: the file {raw[:200]!r} is over {MAX_IMAGE_BYTES:,} bytes",
                       field=where)
    return data
