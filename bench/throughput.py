"""CPU training throughput: the tunestudio worker (precision: auto) against a plain TRL script in fp32.

One run, one machine, the same locally built ~30M-parameter Llama (hidden 512,
8 layers), the same data (bundled rows joined into ~256-token texts), the same
steps, full fine-tuning:
  (a) baseline: a plain SFTTrainer script, in this process, fp32 (bf16/fp16 off);
  (b) tunestudio: the worker in its own process, `precision: auto`.
Both count tokens/s the same way: TRL's num_tokens over the time since the
trainer's on_train_begin, at the last logged step. The loss curves are
compared step by step. MFU = model FLOPs per token × tokens/s ÷ the matmul
peak measured here, now, for the dtype each side used.

    .venv/bin/python bench/throughput.py [--steps 20]

Target (issue 7): (b) ≥ 1.5 × (a), losses within tolerance. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SEQ, BATCH, LR = 256, 8, 1e-4
LOSS_TOLERANCE = 0.05  # mean relative difference of the step losses


def build_model(work: Path) -> Path:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from tunestudio.worker.tiny import build_tiny_model

    tiny = build_tiny_model(work / "tiny")  # for its tokenizer
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
                         num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=512,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    out = work / "llama-30m"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def write_data(work: Path) -> Path:
    from tunestudio.worker.tiny import alpaca_user_text, make_rows

    rows = make_rows(2400, seed=5)
    texts = [" ".join(f"{alpaca_user_text(r)}\n{r['output']}" for r in rows[i : i + 14]) for i in range(0, 2400, 14)]
    path = work / "long.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


def matmul_peak(dtype: Any) -> float:
    import torch

    a = torch.randn(2048, 2048).to(dtype)
    b = torch.randn(2048, 2048).to(dtype)
    for _ in range(3):
        a @ b
    runs = 10
    start = time.perf_counter()
    for _ in range(runs):
        a @ b
    return 2 * 2048**3 * runs / (time.perf_counter() - start)


def plain_trl(model_dir: Path, data: Path, steps: int) -> dict[str, Any]:
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.t0 = 0.0
            self.last: dict[str, float] = {}
            self.losses: list[float] = []

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.t0 = time.monotonic()

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "loss" in logs:
                self.losses.append(logs["loss"])
                self.last = {"tokens": logs["num_tokens"], "seconds": time.monotonic() - self.t0}

    torch.manual_seed(0)
    clock = Clock()
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        args=SFTConfig(output_dir=str(model_dir.parent / "plain-out"), max_steps=steps,
                       per_device_train_batch_size=BATCH, learning_rate=LR, max_length=SEQ, logging_steps=1,
                       save_strategy="no", report_to=[],
                       bf16=False, fp16=False, use_cpu=True, seed=7, disable_tqdm=True,
                       activation_checkpointing=False),  # SFTConfig turns it on by default: slower, not best plain
        train_dataset=load_dataset("json", data_files=str(data), split="train"),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        callbacks=[clock],
    )
    trainer.train()
    return {"tokens_per_s": clock.last["tokens"] / clock.last["seconds"], "losses": clock.losses,
            "params": sum(p.numel() for p in trainer.model.parameters())}


def tunestudio_worker(model_dir: Path, data: Path, steps: int) -> dict[str, Any]:
    from tunestudio.config import JobConfig
    from tunestudio.events import Log, Progress
    from tunestudio.jobs.supervisor import Supervisor

    cfg = JobConfig.model_validate({
        "model_name": str(model_dir), "local_datasets": [str(data)], "output_dir": str(model_dir.parent / "ts-out"),
        "training_type": "full", "precision": "auto", "max_steps": steps, "batch_size": BATCH,
        "gradient_accumulation_steps": 1, "learning_rate": LR, "max_seq_length": SEQ, "random_seed": 7,
        "weight_decay": 0.0, "lr_scheduler_type": "linear", "warmup_steps": 0,
    })
    events: list[Any] = []
    sup = Supervisor(cfg, events.extend, cache_dir=str(model_dir.parent / "cache"))
    sup.start()
    outcome = sup.wait(1800)
    assert outcome is not None and outcome.kind == "completed", outcome
    progress = [e for e in events if isinstance(e, Progress) and e.loss is not None]
    logs = [e.message for e in events if isinstance(e, Log)]
    decided = [m for m in logs if m.startswith("precision auto → ")]  # worker/train/calibrate.py's log line
    precision = decided[0].split("→ ")[1].split()[0] if decided else "fp32"
    return {"tokens_per_s": progress[-1].tokens_per_second, "losses": [e.loss for e in progress],
            "precision": precision}


def main() -> None:
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-throughput-"))
    model_dir = build_model(work)
    data = write_data(work)
    peaks = {"fp32": matmul_peak(torch.float32), "bf16": matmul_peak(torch.bfloat16)}
    plain = plain_trl(model_dir, data, args.steps)
    ours = tunestudio_worker(model_dir, data, args.steps)
    params = plain["params"]
    cfg = json.loads((model_dir / "config.json").read_text())
    # 6N per token for forward+backward, plus attention scores: 12 · layers · hidden · seq.
    flops_per_token = 6 * params + 12 * cfg["num_hidden_layers"] * cfg["hidden_size"] * SEQ
    mfu_plain = flops_per_token * plain["tokens_per_s"] / peaks["fp32"]
    mfu_ours = flops_per_token * ours["tokens_per_s"] / peaks[ours["precision"]]
    pairs = list(zip(plain["losses"], ours["losses"], strict=False))
    loss_diff = sum(abs(a - b) / a for a, b in pairs) / len(pairs)
    ratio = ours["tokens_per_s"] / plain["tokens_per_s"]
    print(f"model: {params / 1e6:.1f}M parameters, seq {SEQ}, batch {BATCH}, {args.steps} steps, full fine-tune")
    print(f"matmul peak here: fp32 {peaks['fp32'] / 1e9:.0f} GFLOP/s, bf16 {peaks['bf16'] / 1e9:.0f} GFLOP/s")
    print(f"(a) plain TRL, fp32:        {plain['tokens_per_s']:8.0f} tok/s  MFU {mfu_plain:.1%}")
    print(f"(b) tunestudio, auto={ours['precision']}: {ours['tokens_per_s']:8.0f} tok/s  MFU {mfu_ours:.1%}")
    print(f"ratio (b)/(a): {ratio:.2f} (target >= 1.5); mean relative loss difference {loss_diff:.3%} "
          f"(tolerance {LOSS_TOLERANCE:.0%})")
    print(json.dumps({"bench": "throughput", "params": params, "steps": args.steps, "seq": SEQ,
                      "tokens_per_s_plain_fp32": round(plain["tokens_per_s"], 1),
                      "tokens_per_s_tunestudio": round(ours["tokens_per_s"], 1), "precision": ours["precision"],
                      "ratio": round(ratio, 3), "target": 1.5, "mfu_plain": round(mfu_plain, 4),
                      "mfu_tunestudio": round(mfu_ours, 4), "peak_fp32_gflops": round(peaks["fp32"] / 1e9, 1),
                      "peak_bf16_gflops": round(peaks["bf16"] / 1e9, 1), "loss_rel_diff": round(loss_diff, 4),
                      "loss_ok": loss_diff <= LOSS_TOLERANCE, "met": ratio >= 1.5 and loss_diff <= LOSS_TOLERANCE}))


if __name__ == "__main__":
    main()
