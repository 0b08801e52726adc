"""Small pictures and image rows for the image data tests (worker/data/images.py, image_data.py, the report):
written with Pillow into a test's tmp_path, a few pixels each, so reading them costs nothing."""

from __future__ import annotations

import base64
import io
import json
import struct
import zlib
from pathlib import Path
from typing import Any

RED, GREEN, BLUE = (220, 30, 30), (30, 170, 60), (30, 60, 220)


def picture(colour: tuple[int, int, int] = RED, size: tuple[int, int] = (16, 12), fmt: str = "PNG",
            **save: Any) -> bytes:
    """An encoded picture: a plain colour with one odd pixel (so two colours never share bytes)."""
    from PIL import Image

    image = Image.new("RGB", size, colour)
    image.putpixel((0, 0), (colour[2], colour[0], colour[1]))
    out = io.BytesIO()
    image.save(out, fmt, **save)
    return out.getvalue()


def write_picture(path: Path, colour: tuple[int, int, int] = RED, size: tuple[int, int] = (16, 12),
                  fmt: str = "PNG") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(picture(colour, size, fmt))
    return path


def data_url(raw: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(raw).decode()}"


def huge_png(width: int = 100_000, height: int = 100_000) -> bytes:
    """A PNG whose header claims width × height pixels, with almost no data: a decompression bomb's shape."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0")) + chunk(b"IEND", b"")


def chat(images: list[Any] | None, question: str = "What colour is it?", answer: str = "red",
         placeholders: int | None = None) -> dict[str, Any]:
    """A row in the Hugging Face / TRL layout: `images`, and one {"type": "image"} placeholder per image."""
    n = len(images or []) if placeholders is None else placeholders
    row: dict[str, Any] = {"messages": [
        {"role": "user", "content": [*([{"type": "image"}] * n), {"type": "text", "text": question}]},
        {"role": "assistant", "content": [{"type": "text", "text": answer}]}]}
    if images is not None:
        row["images"] = images
    return row


def openai_row(urls: list[str], question: str = "What colour is it?", answer: str = "red") -> dict[str, Any]:
    """A row as OpenAI's vision fine-tuning takes it: image_url content parts."""
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return {"messages": [{"role": "user", "content": [{"type": "text", "text": question}, *parts]},
                         {"role": "assistant", "content": answer}]}


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def colour_rows(folder: Path, n: int, name: str = "train.jsonl") -> Path:
    """`n` good rows, each its own picture (pics/NN.png), written as `name` in `folder`."""
    rows = []
    for i in range(n):
        write_picture(folder / "pics" / f"{i:02d}.png", (10 * i % 256, 100, 200 - i))
        rows.append(chat([f"pics/{i:02d}.png"], answer=f"colour {i}"))
    return write_jsonl(folder / name, rows)
