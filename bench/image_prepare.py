"""Preparing an image job's dataset (worker/data/image_data.py prepare_images): time and peak memory on photo-sized
pictures, in a spawned child (its ru_maxrss is the figure), after the child's imports.

It writes --rows PNG files of --side × --side random pixels (incompressible: a photo's worth of bytes) under a
temporary folder, with a JSONL file naming them in the Hugging Face layout, then prepares them as a job does:
every image opened, decoded in full and checked (and, with --model, measured with that model's processor), the
rows split, and the dataset built. It checks every row was kept and one row's image reads back at its size.

    .venv/bin/python bench/image_prepare.py [--rows 200] [--side 1024] [--model models/tiny-smolvlm]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any


def write(folder: Path, rows: int, side: int) -> Path:
    from PIL import Image

    lines = []
    for i in range(rows):
        noise = Image.frombytes("RGB", (side, side), os.urandom(side * side * 3))
        noise.save(folder / f"{i:05d}.png", compress_level=1)
        lines.append(json.dumps({"images": [f"{i:05d}.png"], "messages": [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": f"picture {i}"}]}]}))
    path = folder / "train.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _child(path: str, model: str | None, side: int, out: Any) -> None:
    from tunestudio.config import JobConfig
    from tunestudio.worker.data.image_data import prepare_images
    from tunestudio.worker.modalities.image import ImageModality

    cfg = JobConfig.model_validate({"model_name": model or "unused", "local_datasets": [path],
                                    "is_dataset_image": True, "max_seq_length": 4096})
    processor = ImageModality().load_processor(cfg) if model else None
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    data = prepare_images(cfg, processor)
    seconds = time.perf_counter() - started
    assert data.dropped == 0 and data.train[len(data.train) - 1]["images"][0].size == (side, side)
    out.send({"seconds": round(seconds, 2), "rows": len(data.train),
              "rss_before_mib": round(before / 1024), "peak_rss_mib": round(resource.getrusage(
                  resource.RUSAGE_SELF).ru_maxrss / 1024)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--side", type=int, default=1024)
    parser.add_argument("--model", default=None, help="measure the rows with this vision model's processor")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = write(Path(tmp), args.rows, args.side)
        pixels = args.rows * args.side * args.side * 3 / 2**20
        receive, send = mp.get_context("spawn").Pipe(duplex=False)
        child = mp.get_context("spawn").Process(target=_child, args=(str(path), args.model, args.side, send))
        child.start()
        result = receive.recv()
        child.join()
    result.update(rows_asked=args.rows, side=args.side, decoded_pixels_mib=round(pixels), model=args.model)
    print(f"{result['rows']} rows of {args.side} px ({result['decoded_pixels_mib']} MiB of pixels decoded): "
          f"{result['seconds']} s, peak RSS {result['peak_rss_mib']} MiB (after imports {result['rss_before_mib']})")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
