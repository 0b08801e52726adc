"""Chat API against a plain generate loop: time to first token and tokens/s on the same job.

A short LoRA job is trained (the weights do not matter, the shape does: base
model + adapter). Then, in alternating rounds:

- API: a `tunestudio serve` process (its inference worker warm after one
  warm-up request); this process streams `POST /v1/chat/completions` with
  httpx and stamps each content chunk as it arrives;
- plain: this process loads the same base model and adapter with peft and
  calls `model.generate` with a streamer that stamps each token.

- llama.cpp (`--llama`, issue 29): the job's own GGUF export (`q8_0` by
  default), made by the studio's export job, decoded by llama.cpp's prebuilt
  CPU build through node-llama-cpp (bench/llamacpp/decode.mjs; install it once
  with `cd bench/llamacpp && npm i -E node-llama-cpp@3.21.1`), fed the same
  prompt token ids.

The API's chat engine is the server's `TUNESTUDIO_CHAT_ENGINE` (`--engine`, issue 40): with auto or llama.cpp
the rounds begin once the worker says llama.cpp serves the job (its base's q8_0 copy and the job's merged copy,
serve/llamacpp.py), warm-up requests sent meanwhile; the seconds from the first request to then are printed
(`llama_cpp_after_s`). With `--llama` the merged copy's tensors are compared with the export's, byte for byte.
With auto on a model below its size bound, or where PyTorch measured faster, the wait ends at its deadline and
PyTorch's figures are reported as such.

Both sides generate the same prompt greedily, exactly `--tokens` tokens
(`min_tokens`, the API's extension, and `min_new_tokens`), with every core.
Time to first token: request (or call) → first token. Tokens/s: (tokens − 1)
/ (last token − first token). Targets: API tokens/s ≥ 0.9 × plain's; warm
API TTFT ≤ 1.5 × plain's; with `--llama`: API tokens/s ≥ 0.5 × llama.cpp's,
TTFT ≤ 1.5 × llama.cpp's. The API's answer is compared with plain's (the
studio's path before issue 29: the peft model in fp32): same text or not.

    .venv/bin/python bench/inference.py                 # the 13.4M Llama of bench/worker_overhead.py
    .venv/bin/python bench/inference.py --model tiny    # models/tiny-llama (1.2M; TTFT is ~ms, HTTP dominates)
    .venv/bin/python bench/inference.py --model real --llama --tokens 64 --threads 2
                                                        # bench/chat_model.py's 256M model, 262k vocabulary

The last line of output is one JSON object with all figures.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

PROMPT = ("Repeat the word three times.\n\napple. " * 12).strip()  # ~100 prompt tokens: prefill counts in TTFT


def prompt(round_no: int) -> str:
    """Each round's prompt begins differently: no side reuses the last round's computed prompt (the chat
    worker's llama.cpp engine keeps a prompt's KV memory for one that begins as it did)."""
    return f"Round {round_no}. {PROMPT}"
TARGET_TPS_RATIO = 0.9
TARGET_TTFT_RATIO = 1.5
LLAMA_TPS_RATIO = 0.5  # issue 29: against llama.cpp's q8_0
LLAMA_TTFT_RATIO = 1.5
LLAMA_DIR = Path(__file__).resolve().parent / "llamacpp"


def build_bench_model(directory: Path) -> int:
    """bench/worker_overhead.py's 13.4M Llama, pre-trained briefly as the tiny model is, so that it writes words.

    (A random model greedily repeats byte tokens that are half a character each: no text would stream.)
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from worker_overhead import Settings as ModelSettings
    from worker_overhead import build_model

    from tunestudio.worker.tiny import _pretrain

    params = build_model(directory, ModelSettings())
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    _pretrain(model, tokenizer, seed=1234, steps=60, batch_size=16)
    model.save_pretrained(directory)
    return params


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_llama_cpp(client: Any, url: str, model_id: str, timeout_s: float = 300,
                       merged: bool = True) -> tuple[float | None, str]:
    """Seconds until the worker serves the job through llama.cpp (its model and the job's merged copy announced,
    or its adapter with `merged` False), warm-up requests sent meanwhile, and how it serves the job then: "merged
    copy", "adapter" or "PyTorch"; the seconds are None when what was waited for did not come within `timeout_s`
    (a merged copy, for a model outside the sizes that merge: "adapter" then says llama.cpp serves it)."""
    started = time.perf_counter()
    how = "PyTorch"
    while time.perf_counter() - started < timeout_s:
        loaded = client.get(f"{url}/api/inference", timeout=30).json()["loaded"]
        if any("(llama.cpp q8_0)" in key for key in loaded):
            seen = [name for name, marker in (("merged copy", "(llama.cpp merged q8_0)"),
                                              ("adapter", "(llama.cpp adapter)"))
                    if any(marker in key for key in loaded)]
            how = seen[0] if seen else how
            if how == "merged copy" or (how == "adapter" and not merged):
                return time.perf_counter() - started, how
        api_round(client, url, model_id, 4)
        time.sleep(1)
    return None, how


def start_server(home: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "TUNESTUDIO_HOME": str(home)}
    proc = subprocess.Popen([sys.executable, "-m", "tunestudio.cli", "serve", "--port", str(port)], env=env,
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import httpx

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the server did not start")


def train_job(url: str, model: Path, steps: int = 5) -> dict[str, Any]:
    import httpx

    config = {"model_name": str(model), "local_datasets": [str(ROOT / "examples" / "data" / "alpaca.jsonl")],
              "training_type": "lora", "max_steps": steps, "batch_size": 4, "gradient_accumulation_steps": 1,
              "max_seq_length": 128, "logging_steps": 1}
    job_id = httpx.post(f"{url}/api/jobs", json=config, timeout=30).raise_for_status().json()["id"]
    return wait_job(url, job_id)


def wait_job(url: str, job_id: str, timeout_s: float = 1800) -> dict[str, Any]:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = httpx.get(f"{url}/api/jobs/{job_id}", timeout=30).json()
        if job["status"] in ("completed", "failed", "cancelled", "stopped", "interrupted"):
            if job["status"] != "completed":
                raise RuntimeError(f"the job ended {job['status']}: {job['error']}")
            return job
        time.sleep(0.5)
    raise RuntimeError(f"the job {job_id} did not finish")


def export_gguf(url: str, job_id: str, quantization: str) -> Path:
    """The job's GGUF export, made by the studio's own export job (merged LoRA, llama.cpp's converter)."""
    import httpx

    created = httpx.post(f"{url}/api/jobs/{job_id}/exports", json={"target": "gguf", "quantization": quantization},
                         timeout=30).raise_for_status().json()
    export = wait_job(url, created["id"])
    return Path(export["output_dir"]) / f"model-{quantization}.gguf"


def same_tensors(export: Path, cache: Path) -> bool | None:
    """Whether the chat worker's merged copy of the job (serve/llamacpp.py) holds the same tensors, byte for byte,
    as the job's GGUF export (their metadata differ: names); None when the worker made none."""
    from gguf import GGUFReader

    copies = list(cache.glob("*/merged-*.gguf"))
    if len(copies) != 1:
        return None
    ours, theirs = GGUFReader(copies[0]), GGUFReader(export)
    return [t.name for t in ours.tensors] == [t.name for t in theirs.tensors] and all(
        a.tensor_type == b.tensor_type and a.data.tobytes() == b.data.tobytes()
        for a, b in zip(ours.tensors, theirs.tensors, strict=True))


class Llama:
    """llama.cpp in a Node process (bench/llamacpp/decode.mjs), the GGUF loaded once, fed token ids."""

    def __init__(self, gguf: Path, threads: int) -> None:
        if not (LLAMA_DIR / "node_modules" / "node-llama-cpp").is_dir():
            raise SystemExit(f"llama.cpp's side needs node-llama-cpp: cd {LLAMA_DIR} && npm i -E node-llama-cpp@3.21.1")
        self.proc = subprocess.Popen(["node", str(LLAMA_DIR / "decode.mjs"), str(gguf), str(threads)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=LLAMA_DIR)
        self.ready = self._read()

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("llama.cpp's process ended")
            if line.startswith("{"):
                return json.loads(line)

    def round(self, ids: list[int], tokens: int) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"ids": ids, "tokens": tokens}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def api_round(client: Any, url: str, model_id: str, tokens: int, text: str = PROMPT) -> dict[str, float]:
    body = {"model": model_id, "messages": [{"role": "user", "content": text}], "temperature": 0,
            "max_tokens": tokens, "min_tokens": tokens, "stream": True, "stream_options": {"include_usage": True}}
    stamps: list[float] = []
    usage = None
    text = ""
    start = time.perf_counter()
    with client.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            elif chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                stamps.append(time.perf_counter())
                text += chunk["choices"][0]["delta"]["content"]
    assert usage is not None and usage["completion_tokens"] == tokens, usage
    # Chunks may carry several tokens when the client falls behind: the rate counts tokens, not chunks.
    spread = stamps[-1] - stamps[0]  # 0 when every token came in one chunk (a warm-up's few, a tiny model's)
    return {"ttft_ms": (stamps[0] - start) * 1000, "tokens_per_s": (tokens - 1) / spread if spread else float("inf"),
            "chunks": len(stamps), "text": text}


class Plain:
    """The same job in this process: base model + adapter through peft, `model.generate` with a stamping streamer."""

    def __init__(self, base: str, adapter: str) -> None:
        import torch
        from peft import PeftModel
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(adapter)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        self.model = PeftModel.from_pretrained(model, adapter).eval()

    def prompt_ids(self, text: str = PROMPT) -> list[int]:
        return list(self.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                       add_generation_prompt=True, return_dict=True)["input_ids"])

    def round(self, tokens: int, text: str = PROMPT) -> dict[str, Any]:
        from transformers.generation.streamers import BaseStreamer

        stamps: list[float] = []

        class Stamp(BaseStreamer):
            seen_prompt = False

            def put(self, value: Any) -> None:
                if self.seen_prompt:
                    stamps.append(time.perf_counter())
                self.seen_prompt = True

            def end(self) -> None:
                pass

        start = time.perf_counter()
        # A request arrives as messages: the chat template and the tokenizer are part of answering it.
        ids = self.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                 return_tensors="pt", return_dict=True)["input_ids"]
        with self.torch.inference_mode():
            out = self.model.generate(ids, attention_mask=self.torch.ones_like(ids), max_new_tokens=tokens,
                                      min_new_tokens=tokens, do_sample=False, use_cache=True, streamer=Stamp(),
                                      pad_token_id=self.tokenizer.pad_token_id, temperature=None, top_p=None,
                                      top_k=None)
        assert out.shape[1] - ids.shape[1] == tokens
        return {"ttft_ms": (stamps[0] - start) * 1000, "tokens_per_s": (tokens - 1) / (stamps[-1] - stamps[0]),
                "text": self.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)}


def main(argv: list[str] | None = None) -> int:
    import httpx

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["bench", "tiny", "real"], default="bench")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="torch's and llama.cpp's threads on this side (the API's worker takes every core)")
    parser.add_argument("--llama", action="store_true", help="also llama.cpp on the job's GGUF export (issue 29)")
    parser.add_argument("--quantization", default="q8_0", help="the GGUF export llama.cpp decodes")
    parser.add_argument("--engine", choices=["auto", "torch", "llama.cpp"], default="auto",
                        help="the server's chat engine (TUNESTUDIO_CHAT_ENGINE)")
    parser.add_argument("--first-after", type=float, default=0.0,
                        help="seconds between the job's end and its first chat request (the server's warm-up, "
                             "TUNESTUDIO_CHAT_WARMUP, loads the model meanwhile)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="bench-inference-", dir=ROOT / "outputs" if (ROOT / "outputs").is_dir()
                                     else None) as tmp:
        home = Path(tmp) / "home"
        if args.model == "tiny":
            model = ROOT / "models" / "tiny-llama"
        elif args.model == "real":
            from chat_model import ensure

            model = ensure(ROOT / "outputs" / "bench-chat-model")  # built once, kept (git-ignored)
        else:
            model = Path(tmp) / "model"
            params = build_bench_model(model)
            print(f"model: {params:,} parameters", flush=True)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        os.environ["TUNESTUDIO_CHAT_ENGINE"] = args.engine  # the server and its chat worker read it
        server = start_server(home, port)
        llama = None
        try:
            job = train_job(url, model)
            print(f"job {job['id']} trained; adapter in {job['output_dir']}", flush=True)
            # One client for the run, as OpenAI's does: a client per request would pay ~40 ms for its own set-up
            # (httpx builds an SSL context) on every request, which is no part of answering it.
            client = httpx.Client()
            time.sleep(args.first_after)
            started = time.perf_counter()
            api_round(client, url, job["id"], 4)  # starts the worker and loads the model (unless warmed)
            cold_s = time.perf_counter() - started
            switched_s, how = None, "PyTorch"
            if args.engine != "torch":
                switched_s, how = wait_for_llama_cpp(client, url, job["id"], merged=args.engine == "auto")
                print(f"the job is answered through {how}" + (
                    f", {switched_s:.1f} s after the first request" if switched_s is not None else ""), flush=True)
            import torch

            torch.set_num_threads(args.threads)
            plain = Plain(str(model), job["output_dir"])
            plain.round(4)  # the same warm-up on this side
            sides = ["api", "plain"]
            if args.llama:
                gguf = export_gguf(url, job["id"], args.quantization)
                print(f"GGUF export: {gguf} ({gguf.stat().st_size / 2**20:.0f} MiB)", flush=True)
                merged_same = same_tensors(gguf, home / "cache" / "gguf")
                print(f"the chat worker's merged copy holds the export's tensors: {merged_same}", flush=True)
                llama = Llama(gguf, args.threads)
                print(f"llama.cpp loaded it in {llama.ready['load_ms']:.0f} ms", flush=True)
                llama.round(plain.prompt_ids(), 4)
                sides.append("llama")
            rounds: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
            for i in range(args.rounds):
                order = sides[i % len(sides):] + sides[: i % len(sides)]  # each side first in turn
                for side in order:
                    if side == "api":
                        figures = api_round(client, url, job["id"], args.tokens, prompt(i + 1))
                    elif side == "plain":
                        figures = plain.round(args.tokens, prompt(i + 1))
                    else:
                        figures = llama.round(plain.prompt_ids(prompt(i + 1)), args.tokens)
                    rounds[side].append(figures)
                    print(f"round {i + 1} {side:5}: TTFT {figures['ttft_ms']:7.1f} ms, "
                          f"{figures['tokens_per_s']:7.1f} tok/s", flush=True)
        finally:
            if llama is not None:
                llama.close()
            server.terminate()
            server.wait(30)

    med = {side: {k: statistics.median(r[k] for r in runs) for k in ("ttft_ms", "tokens_per_s")}
           for side, runs in rounds.items()}
    tps_ratio = med["api"]["tokens_per_s"] / med["plain"]["tokens_per_s"]
    ttft_ratio = med["api"]["ttft_ms"] / med["plain"]["ttft_ms"]
    # The API's answer begins at its first non-blank character (its reader holds leading blanks back): compared
    # without the ends' blanks. node-llama-cpp stops at an end token (no min_tokens): its text is compared with
    # the API's beginning.
    same = sum(a["text"].strip() == p["text"].strip() for a, p in zip(rounds["api"], rounds["plain"], strict=True))
    if "llama" in rounds:
        decoded = [plain.tokenizer.decode(r["ids"], skip_special_tokens=True).strip() for r in rounds["llama"]]
        same_llama = sum(bool(d) and a["text"].strip().startswith(d)
                         for a, d in zip(rounds["api"], decoded, strict=True))
    print(f"\nmedians over {args.rounds} alternating rounds of {args.tokens} tokens ({args.model} model, "
          f"{args.threads} threads here; load avg {os.getloadavg()[0]:.1f}):")
    print(f"  plain generate : TTFT {med['plain']['ttft_ms']:.1f} ms, {med['plain']['tokens_per_s']:.1f} tok/s")
    print(f"  chat API       : TTFT {med['api']['ttft_ms']:.1f} ms, {med['api']['tokens_per_s']:.1f} tok/s "
          f"(first request, worker start + load: {cold_s:.1f} s)")
    print(f"  tokens/s ratio {tps_ratio:.3f} (target ≥ {TARGET_TPS_RATIO}: "
          f"{'met' if tps_ratio >= TARGET_TPS_RATIO else 'MISSED'})")
    print(f"  TTFT ratio     {ttft_ratio:.3f} (target ≤ {TARGET_TTFT_RATIO}: "
          f"{'met' if ttft_ratio <= TARGET_TTFT_RATIO else 'MISSED'})")
    print(f"  answers        API text == plain's in {same} of {args.rounds} rounds")
    result: dict[str, Any] = {"model": args.model, "tokens": args.tokens, "threads": args.threads, "rounds": rounds,
                              "median": med, "first_after_s": args.first_after, "cold_first_request_s": cold_s,
                              "tokens_per_s_ratio": tps_ratio, "ttft_ratio": ttft_ratio, "same_text": same,
                              "engine": args.engine, "llama_cpp_after_s": switched_s, "served_through": how,
                              "merged_copy_equals_export": merged_same if args.llama else None}
    if "llama" in med:
        llama_tps = med["api"]["tokens_per_s"] / med["llama"]["tokens_per_s"]
        llama_ttft = med["api"]["ttft_ms"] / med["llama"]["ttft_ms"]
        print(f"  llama.cpp {args.quantization:5}: TTFT {med['llama']['ttft_ms']:.1f} ms, "
              f"{med['llama']['tokens_per_s']:.1f} tok/s")
        print(f"  API / llama.cpp tokens/s {llama_tps:.3f} (target ≥ {LLAMA_TPS_RATIO}: "
              f"{'met' if llama_tps >= LLAMA_TPS_RATIO else 'MISSED'}); "
              f"TTFT {llama_ttft:.3f} (target ≤ {LLAMA_TTFT_RATIO}: "
              f"{'met' if llama_ttft <= LLAMA_TTFT_RATIO else 'MISSED'})")
        print(f"  answers        API text == llama.cpp's in {same_llama} of {args.rounds} rounds")
        result.update(llama_tokens_per_s_ratio=llama_tps, llama_ttft_ratio=llama_ttft, same_text_llama=same_llama)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
