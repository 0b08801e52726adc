"""The bundled image dataset: coloured shapes drawn with Pillow, a question, a one-word answer.

What the tiny vision models (worker/tiny_vision.py) can learn on a CPU in minutes: a closed set of answers (four
colours) read off the picture, not copied from the text (the tiny models cannot copy, FACTS.md). The
held-out rows are new drawings of the same classes (their own seed: other positions, sizes, tints and noise), so
no held-out image is in training, while every answer is. Rows use the Hugging Face / TRL layout: an `images`
column of paths relative to the data file, and `messages` whose user turn holds an {"type": "image"} placeholder.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

COLOURS = ("red", "green", "blue", "yellow")
SHAPES = ("circle", "square", "triangle")
# Asked of every picture, in turn; the answer is its colour. Shapes vary the pictures but are not asked: the tiny
# vision tower (4 image tokens of 64 px) does not learn to tell them apart in a CPU demo's minutes (measured: 10 of
# 24 held-out shape questions right, chance 8, after 100 LoRA steps, where it had every colour question right).
QUESTIONS = ("What colour is the shape?", "Which colour is it?", "What colour do you see?")
# What the tiny vision models' own pre-training shows them (worker/tiny_vision.py): other colours, other shapes,
# another question, so that they learn to look at a picture but know none of the demo's answers.
PRETRAIN_COLOURS = ("orange", "purple", "cyan", "pink", "brown", "black")
PRETRAIN_SHAPES = ("diamond", "cross", "ring")
PRETRAIN_QUESTION = "What is in the picture?"
_RGB = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 70, 220), "yellow": (230, 210, 40),
        "orange": (240, 140, 30), "purple": (140, 50, 170), "cyan": (40, 200, 210), "pink": (240, 130, 190),
        "brown": (120, 75, 40), "black": (30, 30, 30)}
TRAIN_ROWS, EVAL_ROWS, SEED = 480, 48, 4242
SIDE = 64


def draw(colour: str, shape: str, rng: random.Random, side: int = SIDE) -> Any:
    """One picture: a light, slightly tinted background with noise, the shape in the colour (jittered)."""
    from PIL import Image, ImageDraw

    background = tuple(rng.randint(200, 250) for _ in range(3))
    image = Image.new("RGB", (side, side), background)
    pixels = image.load()
    for _ in range(side * 2):  # speckles, so no two pictures are alike
        pixels[rng.randrange(side), rng.randrange(side)] = tuple(rng.randint(150, 255) for _ in range(3))
    size = rng.randint(side * 2 // 5, side * 3 // 4)
    x0, y0 = rng.randint(2, side - size - 2), rng.randint(2, side - size - 2)
    fill = tuple(max(0, min(255, c + rng.randint(-25, 25))) for c in _RGB[colour])
    pen = ImageDraw.Draw(image)
    box = (x0, y0, x0 + size, y0 + size)
    if shape == "circle":
        pen.ellipse(box, fill=fill)
    elif shape == "square":
        pen.rectangle(box, fill=fill)
    elif shape == "triangle":
        pen.polygon([(x0 + size // 2, y0), (x0, y0 + size), (x0 + size, y0 + size)], fill=fill)
    elif shape == "diamond":
        half = size // 2
        pen.polygon([(x0 + half, y0), (x0 + size, y0 + half), (x0 + half, y0 + size), (x0, y0 + half)], fill=fill)
    elif shape == "cross":
        third = size // 3
        pen.rectangle((x0 + third, y0, x0 + 2 * third, y0 + size), fill=fill)
        pen.rectangle((x0, y0 + third, x0 + size, y0 + 2 * third), fill=fill)
    else:  # ring
        pen.ellipse(box, outline=fill, width=max(3, size // 6))
    return image


def make_rows(n: int, seed: int, folder: Path, prefix: str) -> list[dict[str, Any]]:
    """`n` rows, their pictures written as PNG files under `folder` (named `prefix`-NNNN.png)."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(n):
        colour, shape = rng.choice(COLOURS), rng.choice(SHAPES)
        question = QUESTIONS[i % len(QUESTIONS)]
        name = f"{prefix}-{i:04d}.png"
        draw(colour, shape, rng).save(folder / name, optimize=True)
        rows.append({
            "images": [f"{folder.name}/{name}"],
            "messages": [
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]},
                {"role": "assistant", "content": [{"type": "text", "text": colour}]},
            ],
        })
    return rows


def write_image_datasets(directory: str | Path) -> list[Path]:
    """shapes.jsonl (training) and shapes_eval.jsonl (held out), their pictures under shapes/."""
    out = Path(directory)
    written = []
    for name, n, seed, prefix in (("shapes.jsonl", TRAIN_ROWS, SEED, "train"),
                                  ("shapes_eval.jsonl", EVAL_ROWS, SEED + 1, "eval")):
        rows = make_rows(n, seed, out / "shapes", prefix)
        path = out / name
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        written.append(path)
    return written
