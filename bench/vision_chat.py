"""Chat with an image against the same prompt without it: time to first token and decode tokens/s (issue 42).

The chat path from the parent on: this process plays the server's part (the image part read by api/chat_images.py,
a data: URL's base64 decoded, the request queued on an `InferencePool`) and the studio's inference worker answers
(Pillow decodes the picture, the processor makes its pixels and tokens, the vision tower encodes it, `generate`
streams). HTTP is left out: bench/inference.py measures it (~10-15 ms a request on a tiny model).

Sides, alternated round by round on one warm worker (each side's first request, the model's load, is left out):
- text: the question alone;
- image: the bundled picture (examples/data/shapes, 64 px) before the question;
- photo: a 1024 x 768 PNG of noise (~2.4 MB) before it: Pillow's decode and the processor's resize included.

Each answer is greedy and exactly `--tokens` tokens (`min_tokens`). Time to first token: from reading the request's
image part to the first text delta. Tokens/s: (tokens - 1) / (last delta - first delta).

    .venv/bin/python bench/vision_chat.py                       # both tiny families, 5 rounds, 32 tokens
    .venv/bin/python bench/vision_chat.py --model DIR --rounds 3  # any local vision-language model folder

The last line of output is one JSON object with all figures.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tunestudio.api.chat_images import read_image  # noqa: E402
from tunestudio.inference import InferencePool  # noqa: E402
from tunestudio.inference_protocol import GenerateParams, ModelSpec  # noqa: E402
from tunestudio.jobs import inference_executor  # noqa: E402
from tunestudio.process import torch_threads  # noqa: E402
from tunestudio.settings import Settings  # noqa: E402

FAMILIES = {"smolvlm": ROOT / "models" / "tiny-smolvlm", "qwen2_vl": ROOT / "models" / "tiny-qwen2-vl"}
PICTURE = ROOT / "examples" / "data" / "shapes" / "eval-0000.png"
QUESTION = "What colour is the shape? Describe it in detail."


def photo() -> bytes:
    """A 1024 x 768 PNG of noise (no compression wins: a phone photo's size)."""
    from PIL import Image

    noise = Image.frombytes("RGB", (1024, 768), random.Random(0).randbytes(1024 * 768 * 3))
    buffer = io.BytesIO()
    noise.save(buffer, "PNG")
    return buffer.getvalue()


def data_url(raw: bytes) -> str:
    import base64

    return "data:image/png;base64," + base64.b64encode(raw).decode()


def turns(url: str | None) -> list[dict[str, Any]]:
    if url is None:
        return [{"role": "user", "content": QUESTION}]
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]


def ask(pool: InferencePool, spec: ModelSpec, url: str | None, tokens: int) -> dict[str, float]:
    """One greedy answer of exactly `tokens` tokens: TTFT (ms), tokens/s and prompt tokens."""
    params = GenerateParams(max_tokens=tokens, min_tokens=tokens, temperature=0)
    began = time.perf_counter()
    images = (read_image("messages[0].content[0]", url, ()),) if url is not None else ()  # the parent's part
    generation = pool.generate(spec, turns(url), params, images=images)
    stamps = [time.perf_counter() for _ in generation]
    done = generation.result()
    if not stamps:
        raise RuntimeError("no text streamed: raise --tokens")
    decode = (done.completion_tokens - 1) / (stamps[-1] - stamps[0]) if stamps[-1] > stamps[0] else float("nan")
    return {"ttft_ms": (stamps[0] - began) * 1000, "tok_s": decode, "prompt_tokens": done.prompt_tokens,
            "tokens": done.completion_tokens}


def measure(pool: InferencePool, folder: Path, sides: dict[str, str | None], rounds: int,
            tokens: int) -> dict[str, Any]:
    spec = ModelSpec(job_id="bench", base=True, base_model=str(folder), weights=str(folder), kind="full",
                     tokenizer=str(folder), modality="image")
    started = time.perf_counter()
    ask(pool, spec, None, 2)  # the worker's start and the model's load
    first_s = time.perf_counter() - started
    for url in sides.values():
        ask(pool, spec, url, 2)  # each side once before it counts
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    for round_number in range(rounds):
        order = list(sides) if round_number % 2 == 0 else list(reversed(sides))
        for name in order:
            runs[name].append(ask(pool, spec, sides[name], tokens))
    out: dict[str, Any] = {"model": str(folder), "first_request_s": round(first_s, 2)}
    for name, results in runs.items():
        out[name] = {"ttft_ms": round(statistics.median(r["ttft_ms"] for r in results), 1),
                     "tok_s": round(statistics.median(r["tok_s"] for r in results), 1),
                     "prompt_tokens": int(results[0]["prompt_tokens"]),
                     "rounds_ttft_ms": [round(r["ttft_ms"], 1) for r in results],
                     "rounds_tok_s": [round(r["tok_s"], 1) for r in results]}
    for name in sides:
        if name != "text":
            out[f"{name}_vs_text"] = {"ttft": round(out[name]["ttft_ms"] / out["text"]["ttft_ms"], 2),
                                      "tok_s": round(out[name]["tok_s"] / out["text"]["tok_s"], 2)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, action="append", help="a local VLM folder (default: both tiny ones)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    folders = args.model or list(FAMILIES.values())
    sides: dict[str, str | None] = {"text": None, "image": data_url(PICTURE.read_bytes()), "photo": data_url(photo())}
    results = []
    with tempfile.TemporaryDirectory() as home:
        pool = InferencePool(Settings(home=Path(home), prewarm=False), inference_executor)
        try:
            for folder in folders:
                result = measure(pool, folder, sides, args.rounds, args.tokens)
                results.append(result)
                print(f"{folder.name} (first request {result['first_request_s']} s):")
                for name in sides:
                    side = result[name]
                    print(f"  {name:6} prompt {side['prompt_tokens']:4} tokens  TTFT {side['ttft_ms']:8.1f} ms  "
                          f"{side['tok_s']:7.1f} tok/s")
        finally:
            pool.close()
    print(json.dumps({"bench": "vision_chat", "threads": torch_threads(), "tokens": args.tokens,
                      "rounds": args.rounds, "load_avg": os.getloadavg()[0], "photo_bytes": len(photo()),
                      "results": results}))


if __name__ == "__main__":
    main()
