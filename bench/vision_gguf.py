"""An image job's GGUF pair in llama.cpp's own multimodal tool (issue 42): the studio's answers, llama.cpp's answers.

The image demo's job (examples/vision.yaml: the tiny SmolVLM taught to name the colour of a drawn shape) is
trained with `tunestudio train`, exported with `tunestudio export --to gguf` (the text model's GGUF, the vision
projector's `mmproj` GGUF, an Ollama Modelfile), and each of the 48 held-out pictures
(examples/data/shapes_eval.jsonl) is asked its question by llama.cpp's `llama-mtmd-cli` (built by `make mtmd` from
the pinned llama-cpp-python sdist's llama.cpp: nothing prebuilt), greedy, one process a picture. Its answers are
compared with the reference and with the studio's own answers to the same rows (the job's final evaluation, PyTorch
with the adapter: eval_rows.json).

    make mtmd   # once, about 10 min on 2 cores
    /work/runtest .venv/bin/python bench/vision_gguf.py [--job-dir DIR] [--quantization f16]

--work DIR: keep the job, its data directory and the export there, and take the job from there on the next run
(default: a temporary folder, removed). Ends with one JSON line; exits 1 when llama.cpp could not load the pair or
answer a picture.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / ".venv" / "bin"
MTMD_CLI = ROOT / "third_party" / "llama.cpp-src" / "build" / "bin" / "llama-mtmd-cli"
EVAL = ROOT / "examples" / "data" / "shapes_eval.jsonl"
JOB = ROOT / "examples" / "vision.yaml"


def train(work: Path, env: dict[str, str]) -> tuple[str, Path]:
    """The demo job trained by the CLI in its own data directory: (job id, output folder)."""
    out = work / "job"
    started = time.monotonic()
    run = subprocess.run([str(BIN / "tunestudio"), "train", str(JOB), "--output-dir", str(out)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=1800)
    if run.returncode != 0:
        raise SystemExit(f"training failed ({run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    found = re.search(r"job (\d{8}-\d{6}-[0-9a-f]+)", run.stdout)
    if not found:
        raise SystemExit(f"no job id in the training output:\n{run.stdout[-2000:]}")
    print(f"trained job {found.group(1)} in {time.monotonic() - started:.0f} s", flush=True)
    return found.group(1), out


def export(job_id: str, work: Path, quantization: str, env: dict[str, str]) -> Path:
    """The job's GGUF export through the CLI; the folder holding model-*.gguf and mmproj-*.gguf."""
    out = work / f"gguf-{quantization}"
    if (out / "export.json").is_file():  # exported by an earlier run with --work
        return out
    run = subprocess.run([str(BIN / "tunestudio"), "export", job_id, "--to", "gguf", "--quantization", quantization,
                          "--output", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    if run.returncode != 0:
        raise SystemExit(f"export failed ({run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    return out


def ask(model: Path, mmproj: Path, image: Path, question: str, threads: int,
        extra: list[str]) -> tuple[str, float, str]:
    """llama.cpp's greedy answer to one picture: (answer, seconds, its log's tail)."""
    started = time.monotonic()
    run = subprocess.run([str(MTMD_CLI), "-m", str(model), "--mmproj", str(mmproj), "--image", str(image),
                          "-p", question, "-n", "12", "--temp", "0", "-t", str(threads), "--seed", "0",
                          "--no-warmup", "-c", "512", "--jinja", *extra],  # --jinja: the model's own template
                         capture_output=True, text=True, timeout=120)
    took = time.monotonic() - started
    if run.returncode != 0:
        return "", took, (run.stderr or run.stdout)[-2000:]
    return run.stdout.strip(), took, run.stderr[-600:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, help="a folder to keep the job and the export in, and reuse")
    parser.add_argument("--quantization", default="f16", help="the GGUF's type (f16, bf16, q8_0, f32)")
    parser.add_argument("--no-repack", action="store_true",
                        help="llama.cpp's --no-repack: on a CPU with AMX its repacked q8_0 matmul crashes on the tiny "
                             "model (2026-12-05, a segfault in ggml_backend_amx_mul_mat)")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("TUNESTUDIO_TORCH_THREADS") or 1))
    args = parser.parse_args()
    if not MTMD_CLI.is_file():
        raise SystemExit(f"{MTMD_CLI.relative_to(ROOT)} is missing: run `make mtmd` first")
    with tempfile.TemporaryDirectory(prefix="vision-gguf-") as tmp:
        work = args.work or Path(tmp)
        env = {**os.environ, "TUNESTUDIO_HOME": str(work / "home")}
        known = work / "job_id"
        if known.is_file():
            job_id, job_dir = known.read_text().strip(), work / "job"
            print(f"job {job_id} from {work}", flush=True)
        else:
            job_id, job_dir = train(work, env)
            known.write_text(job_id)
        rows = json.loads((job_dir / "eval_rows.json").read_text())["rows"]
        studio = {r["line"]: r for r in rows}
        out = export(job_id, work, args.quantization, env)
        model, mmproj = out / f"model-{args.quantization}.gguf", out / f"mmproj-{args.quantization}.gguf"
        print(f"exported: {model.name} ({model.stat().st_size / 2**20:.1f} MiB), {mmproj.name} "
              f"({mmproj.stat().st_size / 2**20:.1f} MiB)", flush=True)

        asked = []
        for line, raw in enumerate(EVAL.read_text().splitlines(), start=1):
            row = json.loads(raw)
            question = next(p["text"] for p in row["messages"][0]["content"] if p.get("type") == "text")
            reference = row["messages"][1]["content"][0]["text"]
            answer, took, log = ask(model, mmproj, EVAL.parent / row["images"][0], question, args.threads,
                                    ["--no-repack"] if args.no_repack else [])
            if not answer:
                print(f"line {line}: llama.cpp gave no answer:\n{log}", flush=True)
            ours = (studio.get(line) or {}).get("answer")
            asked.append({"line": line, "reference": reference, "llama_cpp": answer, "studio": ours, "s": took})
            print(f"line {line:2d}: reference {reference!r:10} studio {ours!r:10} llama.cpp {answer!r}", flush=True)

    def norm(text: Any) -> str:
        return str(text or "").strip().strip(".").lower()

    n = len(asked)
    llama_exact = sum(norm(a["llama_cpp"]) == norm(a["reference"]) for a in asked)
    studio_exact = sum(norm(a["studio"]) == norm(a["reference"]) for a in asked)
    agree = sum(norm(a["llama_cpp"]) == norm(a["studio"]) for a in asked)
    answered = sum(bool(a["llama_cpp"]) for a in asked)
    result = {"bench": "vision_gguf", "rows": n, "answered": answered, "quantization": args.quantization,
              "repack": not args.no_repack,
              "llama_cpp_exact_match": llama_exact / n, "studio_exact_match": studio_exact / n,
              "agreement": agree / n, "median_s_a_picture": statistics.median(a["s"] for a in asked)}
    print(f"llama.cpp answered {answered}/{n}; exact match: llama.cpp {llama_exact}/{n}, studio {studio_exact}/{n}; "
          f"llama.cpp says what the studio says on {agree}/{n}")
    print(json.dumps(result))
    return 0 if answered == n else 1


if __name__ == "__main__":
    sys.exit(main())
