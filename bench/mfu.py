"""MFU of a LoRA job on a model of a real shape (issue 40): the figure by one command, and where a step's time goes.

Model: bench/chat_model.py's (outputs/bench-chat-model, built on first use: Gemma-3-270M's shape as a Llama,
hidden 640, 18 layers, intermediate 2048, 10 heads of 64 and 2 KV heads, a 262,144-token vocabulary, the output
layer tied to the embeddings; 256M parameters).
Job: the tunestudio worker in its own process, every setting at its default (precision auto, padding-free batches
auto, activation checkpointing auto), LoRA r16 alpha 32 on every linear layer of the body, batch 2, max_length
512, texts of 60-900 tokens cut at 512 (bench/precision.py's), declared 10,000 steps and stopped after --steps.

FLOPs of one trained token:
  4 per frozen matmul weight (forward 2, the input's gradient 2): the body's linear layers and the output layer;
  6 per trainable weight (LoRA's A and B: forward 2, the two gradients 4);
  attention: per layer 4 * ctx * heads * head_dim forward (QK^T and AV), three times that in training (forward and
  two gradients), ctx the mean causal context of the trained tokens (a token at position p attends to p + 1),
  taken from the texts as cut;
  the embedding lookup, norms, activations, softmax and the loss are no matmul and are not counted.
tokens/s: the job's trained tokens (TRL's num_tokens) from its --skip-th logged step to its last, over their time.
Peak: a 2048^3 matmul in the precision the job ran in, measured in this process before and after the job (the
higher of the two: the machine is shared).

    .venv/bin/python bench/mfu.py [--steps 8] [--seq 512] [--batch 2] [--rank 16] [--precision auto]
    .venv/bin/python bench/mfu.py --profile 2     # the same job in this process, 2 steps under torch.profiler

The profile runs the worker's own recipe (tunestudio.worker.main.run) in this process and records steps 3 and
on: the time by op, and the matrix products by shape (the output layer's is the one with the vocabulary).
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

MODEL = REPO / "outputs" / "bench-chat-model"


def matmul_weights(config: dict[str, Any]) -> dict[str, int]:
    """The frozen matmul weights: the body's linear layers and the output layer (tied or not, it is a matmul)."""
    hidden, inter, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    body = layers * (hidden * (q + 2 * kv) + q * hidden + 3 * hidden * inter)
    return {"body": body, "output_layer": config["vocab_size"] * hidden}


def lora_weights(config: dict[str, Any], rank: int) -> int:
    """LoRA's A and B on every linear layer of the body: rank * (in + out) each."""
    hidden, inter, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    shapes = [(hidden, q), (hidden, kv), (hidden, kv), (q, hidden), (hidden, inter), (hidden, inter), (inter, hidden)]
    return layers * sum(rank * (a + b) for a, b in shapes)


def mean_context(model_dir: Path, data: Path, seq: int) -> tuple[float, float]:
    """The trained tokens' mean causal context and the texts' mean length, tokenised and cut at seq."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    lengths = [min(seq, len(tokenizer(json.loads(line)["text"])["input_ids"]))
               for line in data.read_text().splitlines()]
    return sum(n * (n + 1) / 2 for n in lengths) / sum(lengths), sum(lengths) / len(lengths)


def flops_per_token(config: dict[str, Any], rank: int, context: float) -> dict[str, float]:
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    weights = matmul_weights(config)
    parts = {"frozen": 4.0 * (weights["body"] + weights["output_layer"]),
             "trainable": 6.0 * lora_weights(config, rank),
             "attention": 3 * 4.0 * context * config["num_attention_heads"] * head_dim * config["num_hidden_layers"]}
    return parts | {"total": sum(parts.values())}


def job_fields(model_dir: Path, data: Path, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    return {"model_name": str(model_dir), "local_datasets": [str(data)], "output_dir": str(out),
            "training_type": "lora", "lora_r": args.rank, "lora_alpha": 2 * args.rank, "precision": args.precision,
            "max_steps": 10_000, "batch_size": args.batch, "gradient_accumulation_steps": 1, "learning_rate": 2e-4,
            "max_seq_length": args.seq, "random_seed": 7, "logging_steps": 1, "save_steps": 0, "eval_steps": 0}


def run_job(fields: dict[str, Any], steps: int, cache: Path) -> dict[str, Any]:
    """The job in its own worker process, stopped after `steps` logged steps: its progress and log lines."""
    from precision import stopped_job

    from tunestudio.events import Log, Progress

    _, events = stopped_job(fields, steps, cache)
    progress = [e for e in events if isinstance(e, Progress) and e.loss is not None][:steps]
    if len(progress) < steps:
        sys.exit(f"the job ended after {len(progress)} steps: " + "; ".join(
            e.message for e in events if isinstance(e, Log))[-2000:])
    return {"progress": [(p.num_tokens, p.elapsed_seconds, p.peak_memory_mb) for p in progress],
            "log": [e.message for e in events if isinstance(e, Log)]}


def steady_rate(progress: list[tuple[int, float, float]], skip: int) -> float:
    (tokens_0, time_0, _), (tokens_1, time_1, _) = progress[skip - 1], progress[-1]
    return (tokens_1 - tokens_0) / (time_1 - time_0)


def chosen_precision(log: list[str], asked: str) -> str:
    """The precision the job ran in: `asked`, or auto's decision from its log line."""
    from precision import decided_precision

    return asked if asked != "auto" else decided_precision(next((m for m in log if m.startswith("precision auto")), ""))


def profile(fields: dict[str, Any], steps: int, cache: Path) -> None:
    """The worker's recipe in this process; from its third training step, `steps` steps under torch.profiler."""
    import torch
    import transformers

    from tests.helpers.channel import ListChannel
    from tunestudio.events import Stop
    from tunestudio.worker.main import run

    channel, calls = ListChannel(), [0]
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True)
    original = transformers.Trainer.training_step

    def training_step(self: Any, *a: Any, **k: Any) -> Any:
        calls[0] += 1
        if calls[0] == 3:
            prof.start()
        if calls[0] == 3 + steps:
            prof.stop()
            channel._stop = Stop(save=False)
        return original(self, *a, **k)

    transformers.Trainer.training_step = training_step  # type: ignore[method-assign]
    try:
        code = run(fields, channel, cache_dir=str(cache))
    finally:
        transformers.Trainer.training_step = original  # type: ignore[method-assign]
    if calls[0] < 3 + steps:
        sys.exit(f"the job ended (exit {code}) after {calls[0]} steps: {channel.lines[-3:]}")
    table = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in table)
    print(f"profile of {steps} steps: {total / 1e6 / steps:.2f} s of CPU time a step (all threads' ops)")
    for e in sorted(table, key=lambda e: -e.self_cpu_time_total)[:25]:
        print(f"  {e.self_cpu_time_total / total:6.1%}  {e.count // steps:6d} calls/step  {e.key}")
    by_shape = prof.key_averages(group_by_input_shape=True)
    for title, keys in (("matrix products", ("aten::mm", "aten::addmm", "aten::bmm")), ("copies", ("aten::copy_",))):
        print(f"{title} by shape:")
        for e in sorted((e for e in by_shape if e.key in keys), key=lambda e: -e.self_cpu_time_total)[:10]:
            print(f"  {e.self_cpu_time_total / total:6.1%}  {e.count / steps:6.1f}/step  {e.key} {e.input_shapes}")


def main() -> None:
    import torch
    from precision import matmul_peak, write_long_texts

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--skip", type=int, default=2, help="logged steps left out of the rate (warm-up)")
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    parser.add_argument("--model", type=Path, default=MODEL, help="a model folder (default: built on first use)")
    parser.add_argument("--profile", type=int, default=0, help="profile this many steps in this process instead")
    args = parser.parse_args()
    if args.steps <= args.skip:
        parser.error("--steps must exceed --skip")
    if args.model == MODEL:
        from chat_model import ensure

        ensure(MODEL)
    work = Path(tempfile.mkdtemp(prefix="bench-mfu-"))
    data = write_long_texts(work)
    fields = job_fields(args.model, data, work / "out", args)
    if args.profile:
        profile(fields, args.profile, work / "cache")
        return
    config = json.loads((args.model / "config.json").read_text())
    context, length = mean_context(args.model, data, args.seq)
    flops = flops_per_token(config, args.rank, context)
    peaks = {"fp32": matmul_peak(torch.float32), "bf16": matmul_peak(torch.bfloat16)}
    job = run_job(fields, args.steps, work / "cache")
    after = {"fp32": matmul_peak(torch.float32), "bf16": matmul_peak(torch.bfloat16)}
    peak = {k: max(peaks[k], after[k]) for k in peaks}
    precision = chosen_precision(job["log"], args.precision)
    rate = steady_rate(job["progress"], args.skip)
    mfu = flops["total"] * rate / peak[precision]
    weights = matmul_weights(config)
    print(f"model {args.model.name}: body {weights['body'] / 1e6:.1f}M + output layer "
          f"{weights['output_layer'] / 1e6:.1f}M matmul weights, LoRA r{args.rank} "
          f"{lora_weights(config, args.rank) / 1e6:.2f}M; seq {args.seq} (texts {length:.0f} tokens on average, "
          f"mean causal context {context:.0f}), batch {args.batch}")
    print("FLOPs a token: " + ", ".join(f"{k} {v / 1e9:.3f} G" for k, v in flops.items()))
    print(f"precision {precision} ({next((m for m in job['log'] if m.startswith('precision auto')), 'as asked')}); "
          f"matmul peak {peak[precision] / 1e9:.0f} GFLOP/s; {rate:.1f} tokens/s over steps {args.skip}-{args.steps}"
          f" -> MFU {mfu:.1%}", flush=True)
    print(json.dumps({"bench": "mfu", "model": str(args.model), "seq": args.seq, "batch": args.batch,
                      "lora_r": args.rank, "precision": precision, "steps": args.steps, "skip": args.skip,
                      "flops_per_token": {k: round(v) for k, v in flops.items()}, "mean_context": round(context, 1),
                      "tokens_per_s": round(rate, 2), "peak_gflops": {k: round(v / 1e9) for k, v in peak.items()},
                      "mfu": round(mfu, 4), "peak_memory_mb": job["progress"][-1][2],
                      "notes": [m for m in job["log"] if m.startswith(("padding-free", "activation", "LM head",
                                                                       "model:"))],
                      "load": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
