"""`precision: auto` on a model shaped like a real one, against the fixed precisions and plain TRL.

A locally built Llama with a large vocabulary (random weights: the shapes, not
the values, decide the speed), LoRA on every linear layer, short chat-like
rows. In one run, in alternating rounds, the same job:
  tunestudio auto, tunestudio fp32, tunestudio bf16 (the worker, each in its own process),
  plain TRL fp32 and plain TRL bf16 (an SFTTrainer script in a child process).
tokens/s is TRL's num_tokens (real, non-pad tokens) over the time since the
trainer began, at the last logged step; each figure is the best of its rounds.
The first auto job measures and caches its decision; the later ones read it.

    .venv/bin/python bench/precision.py [--steps 40] [--rounds 2] [--vocab 128256]

Targets (issue 18): auto ≥ 0.95 × the faster fixed precision; tunestudio's
best ≥ 0.97 × best plain. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SEQ, BATCH, LR = 128, 4, 2e-4


def build_model(work: Path, vocab: int) -> Path:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from tunestudio.worker.tiny import build_tiny_model

    tiny = build_tiny_model(work / "tiny")  # its tokenizer: ids stay below its size, the head is the full vocab
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    config = LlamaConfig(vocab_size=vocab, hidden_size=576, intermediate_size=1536, num_hidden_layers=12,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=1024,
                         tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    out = work / "llama-real-shape"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def tunestudio_job(model_dir: Path, data: Path, steps: int, precision: str, out: Path, cache: Path) -> dict:
    from tunestudio.config import JobConfig
    from tunestudio.events import Log, Progress
    from tunestudio.jobs.supervisor import Supervisor

    cfg = JobConfig.model_validate({
        "model_name": str(model_dir), "local_datasets": [str(data)], "output_dir": str(out),
        "training_type": "lora", "precision": precision, "max_steps": steps, "batch_size": BATCH,
        "gradient_accumulation_steps": 1, "learning_rate": LR, "max_seq_length": SEQ, "random_seed": 7,
        "lora_r": 16, "lora_alpha": 32, "logging_steps": 1,
    })
    events: list[Any] = []
    sup = Supervisor(cfg, events.extend, cache_dir=str(cache))
    sup.start()
    outcome = sup.wait(3600)
    assert outcome is not None and outcome.kind == "completed", outcome
    progress = [e for e in events if isinstance(e, Progress) and e.loss is not None]
    chosen = next((m.message for m in events if isinstance(m, Log) and m.message.startswith("precision auto")), "")
    return {"tokens_per_s": progress[-1].tokens_per_second, "first_loss": progress[0].loss,
            "last_loss": progress[-1].loss, "peak_memory_mb": progress[-1].peak_memory_mb, "decision": chosen}


def _plain(model_dir: str, data: str, steps: int, bf16: bool, out: str, queue: Any) -> None:
    import time

    import torch
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.t0, self.last = 0.0, 0.0

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.t0 = time.monotonic()

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "loss" in logs:
                self.last = logs["num_tokens"] / (time.monotonic() - self.t0)

    torch.manual_seed(7)
    clock = Clock()
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        args=SFTConfig(output_dir=out, max_steps=steps, per_device_train_batch_size=BATCH, learning_rate=LR,
                       max_length=SEQ, logging_steps=1, save_strategy="no", report_to=[], bf16=bf16, fp16=False,
                       use_cpu=True, seed=7, disable_tqdm=True),
        train_dataset=load_dataset("json", data_files=data, split="train"),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        peft_config=LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM"),
        callbacks=[clock],
    )
    trainer.train()
    queue.put(clock.last)


def plain_job(model_dir: Path, data: Path, steps: int, bf16: bool, out: Path) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_plain, args=(str(model_dir), str(data), steps, bf16, str(out), queue))
    proc.start()
    tps = queue.get(timeout=3600)
    proc.join(60)
    return {"tokens_per_s": tps}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=128_256)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-precision-"))
    model_dir = build_model(work, args.vocab)
    data = REPO / "examples" / "data" / "prompt_completion.jsonl"
    cache = work / "cache"
    runs: dict[str, list[dict]] = {k: [] for k in ("auto", "fp32", "bf16", "plain_fp32", "plain_bf16")}
    for round_ in range(args.rounds):
        for name in runs:
            out = work / f"{name}-{round_}"
            if name.startswith("plain_"):
                runs[name].append(plain_job(model_dir, data, args.steps, name == "plain_bf16", out))
            else:
                runs[name].append(tunestudio_job(model_dir, data, args.steps, name, out, cache))
            print(f"round {round_ + 1} {name:>10}: {runs[name][-1]['tokens_per_s']:8.1f} tok/s", flush=True)
    best = {k: max(r["tokens_per_s"] for r in v) for k, v in runs.items()}
    fixed = max(best["fp32"], best["bf16"])
    plain = max(best["plain_fp32"], best["plain_bf16"])
    ours = max(best["auto"], best["fp32"], best["bf16"])
    cfg = json.loads((model_dir / "config.json").read_text())
    from tunestudio.estimate import estimate

    params = estimate(cfg).parameters
    print(f"model: {params / 1e6:.0f}M parameters, vocab {args.vocab}, LoRA r16, seq {SEQ}, batch {BATCH}, "
          f"{args.steps} steps, {args.rounds} rounds")
    print("auto decided:", runs["auto"][0]["decision"])
    print(f"auto / faster fixed ({'fp32' if best['fp32'] >= best['bf16'] else 'bf16'}): {best['auto'] / fixed:.3f} "
          "(target >= 0.95)")
    print(f"tunestudio defaults (auto) / best plain TRL: {best['auto'] / plain:.3f} (target >= 0.97)")
    print(json.dumps({"bench": "precision", "params": params, "vocab": args.vocab, "seq": SEQ, "steps": args.steps,
                      "tokens_per_s": {k: round(v, 1) for k, v in best.items()},
                      "auto_over_fixed": round(best["auto"] / fixed, 3),
                      "auto_over_best_plain": round(best["auto"] / plain, 3),
                      "best_ours_over_best_plain": round(ours / plain, 3),
                      "peak_memory_mb": runs["auto"][-1]["peak_memory_mb"],
                      "decision": runs["auto"][0]["decision"],
                      "met": best["auto"] >= 0.95 * fixed and best["auto"] >= 0.97 * plain}))


if __name__ == "__main__":
    main()
