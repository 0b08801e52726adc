"""Models shaped like real ones: tunestudio's defaults and `precision: auto` against the fixed precisions and plain TRL.

A locally built Llama of a real shape (SmolLM-135M-like: hidden 576, 12 layers,
9 heads, 3 KV heads, a 128k vocabulary, tied head; random weights: the shapes,
not the values, decide the speed), trained on the CPU in one run, alternating
rounds, for each shape asked:
  lora-128  LoRA r16 on every linear layer, batch 4, max_length 128, short prompt/completion rows
  lora-512  the same at max_length 512 on texts of 60-900 tokens (cut at 512), batch 2
  full-128  a full fine-tune, batch 4, max_length 128
  full-512  a full fine-tune, batch 2, max_length 512
and for each shape five jobs:
  tunestudio auto, tunestudio fp32, tunestudio bf16 (the worker, each in its own process, every other setting
  at its default: padding-free batches auto, activation checkpointing auto),
  plain TRL fp32 and plain TRL bf16 (an SFTTrainer script in a spawned child: padded batches, TRL's default,
  and activation checkpointing off, not TRL's default: on, it is 3.5x slower on a CPU with memory to spare).
The tunestudio jobs are declared long (10,000 steps) and stopped after --steps, as a user's job would be: a
job the worker judges too short is not measured (calibrate.MIN_JOB_S). The first auto job of a shape measures
and caches its decision (its log line is printed); the later ones read the cache.
tokens/s is TRL's num_tokens (real, non-pad tokens) over the time since the trainer began, at the last logged
step; each figure is the best of its rounds. MFU = 6·N·tokens/s over the bf16 or fp32 matmul peak measured
here in the same run (N: parameters, the head included; attention is left out).

    .venv/bin/python bench/precision.py [--steps 8] [--rounds 2] [--shapes lora-128,lora-512,full-128,full-512]
                                        [--jobs auto,fp32,bf16,plain_fp32,plain_bf16] [--model FOLDER]

--model trains a model folder instead (a real pretrained model, downloaded beforehand: this machine has no hub).

Targets (issue 18): auto ≥ 0.95 × the faster fixed precision; tunestudio's defaults ≥ 0.97 × best plain TRL.
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

LR = 2e-4
DECLARED_STEPS = 10_000


@dataclass(frozen=True)
class Shape:
    name: str
    training_type: str
    seq: int
    batch: int


SHAPES = {s.name: s for s in (Shape("lora-128", "lora", 128, 4), Shape("lora-512", "lora", 512, 2),
                              Shape("full-128", "full", 128, 4), Shape("full-512", "full", 512, 2))}


def build_model(work: Path, vocab: int) -> Path:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from tunestudio.worker.tiny import build_tiny_model

    # the embedded tiny model's tokenizer (ids stay below its size; the head is the full vocabulary)
    tiny = REPO / "models" / "tiny-llama"
    if not (tiny / "tokenizer.json").is_file():
        tiny = build_tiny_model(work / "tiny")
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


def write_long_texts(work: Path) -> Path:
    """Texts of very different lengths (4 to 60 bundled rows joined), as real documents are."""
    from tunestudio.worker.tiny import alpaca_user_text, make_rows

    rng = random.Random(3)
    rows = make_rows(4000, seed=5)
    texts, i = [], 0
    while i < len(rows) - 60:
        k = rng.randint(2, 40)
        texts.append(" ".join(f"{alpaca_user_text(r)}\n{r['output']}" for r in rows[i : i + k]))
        i += k
    path = work / "texts.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


def matmul_peak(dtype: Any) -> float:
    import torch

    a, b = torch.randn(2048, 2048).to(dtype), torch.randn(2048, 2048).to(dtype)
    for _ in range(3):
        a @ b
    start = time.perf_counter()
    for _ in range(10):
        a @ b
    return 2 * 2048**3 * 10 / (time.perf_counter() - start)


def stopped_job(fields: dict[str, Any], steps: int, cache: Path, save: bool = False) -> tuple[Any, list[Any]]:
    """A job (JobConfig fields) in its own worker process, stopped after `steps` logged steps: its outcome and its
    events."""
    from tunestudio.config import JobConfig
    from tunestudio.events import Progress
    from tunestudio.jobs.supervisor import Supervisor

    events: list[Any] = []
    sup = Supervisor(JobConfig.model_validate(fields), events.extend, cache_dir=str(cache))
    sup.start()
    deadline = time.monotonic() + 3600
    while time.monotonic() < deadline and sup.wait(0.2) is None:
        if sum(isinstance(e, Progress) and e.loss is not None for e in list(events)) >= steps:
            sup.stop(save=save)
            break
    return sup.wait(600), events


def decided_precision(decision: str) -> str:
    """The precision auto chose, from the worker's "precision auto → ..." log line (fp32 when none is given)."""
    return decision.split("→ ")[1].split()[0] if "→ " in decision else "fp32"


def tunestudio_job(model_dir: Path, data: Path, shape: Shape, steps: int, precision: str, out: Path,
                   cache: Path, save: bool = False) -> dict:
    from tunestudio.events import Log, Progress

    fields: dict[str, Any] = {
        "model_name": str(model_dir), "local_datasets": [str(data)], "output_dir": str(out),
        "training_type": shape.training_type, "precision": precision, "max_steps": DECLARED_STEPS,
        "batch_size": shape.batch, "gradient_accumulation_steps": 1, "learning_rate": LR,
        "max_seq_length": shape.seq, "random_seed": 7, "logging_steps": 1, "save_steps": 0,
    }
    if shape.training_type == "lora":
        fields |= {"lora_r": 16, "lora_alpha": 32}
    outcome, events = stopped_job(fields, steps, cache, save)
    assert outcome is not None and outcome.completed is not None, outcome  # stopped without saving: "cancelled"
    assert not save or outcome.completed.saved, outcome
    progress = [e for e in events if isinstance(e, Progress) and e.loss is not None][:steps]
    logs = [m.message for m in events if isinstance(m, Log)]
    chosen = next((m for m in logs if m.startswith("precision auto")), "")
    return {"tokens_per_s": progress[-1].tokens_per_second, "first_loss": progress[0].loss,
            "last_loss": progress[-1].loss, "peak_memory_mb": progress[-1].peak_memory_mb, "decision": chosen,
            "notes": [m for m in logs if m.startswith(("padding-free", "activation checkpointing"))],
            "output_dir": outcome.completed.output_dir}


def load_with_plain_peft(model_dir: Path, adapter: str, data: Path, seq: int) -> dict[str, Any]:
    """The saved adapter, loaded by plain peft onto the base model (issue 18's check): its LoRA weights are
    the ones written, and on a row of the job's data it changes the base model's loss."""
    import torch
    from peft import PeftModel, get_peft_model_state_dict
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    row = json.loads(data.read_text().splitlines()[0])
    text = row["text"] if "text" in row else row["prompt"] + row["completion"]
    ids = tokenizer(text, return_tensors="pt", truncation=True, max_length=seq)["input_ids"]
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        base_loss = float(base(input_ids=ids, labels=ids).loss)
    model = PeftModel.from_pretrained(base, adapter).eval()
    saved = load_file(str(Path(adapter) / "adapter_model.safetensors"))
    loaded = get_peft_model_state_dict(model)  # named as peft saves them
    matched = sum(k in loaded and torch.equal(loaded[k], v) for k, v in saved.items())
    with torch.no_grad():
        tuned_loss = float(model(input_ids=ids, labels=ids).loss)
    result = {"tensors": len(saved), "matched": matched, "base_loss": round(base_loss, 4),
              "adapter_loss": round(tuned_loss, 4)}
    result["ok"] = bool(saved) and matched == len(saved) and abs(tuned_loss - base_loss) > 1e-4
    return result


def _plain(model_dir: str, data: str, shape: Shape, steps: int, bf16: bool, out: str, queue: Any) -> None:
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
    lora = shape.training_type == "lora"
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        args=SFTConfig(output_dir=out, max_steps=steps, per_device_train_batch_size=shape.batch, learning_rate=LR,
                       max_length=shape.seq, logging_steps=1, save_strategy="no", report_to=[], bf16=bf16,
                       fp16=False, use_cpu=True, seed=7, disable_tqdm=True,
                       # SFTConfig's default is True: 3.5x slower on a CPU with memory to spare; off is best plain
                       activation_checkpointing=False),
        train_dataset=load_dataset("json", data_files=data, split="train"),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        peft_config=LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM") if lora
        else None,
        callbacks=[clock],
    )
    trainer.train()
    queue.put(clock.last)


def plain_job(model_dir: Path, data: Path, shape: Shape, steps: int, bf16: bool, out: Path) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_plain, args=(str(model_dir), str(data), shape, steps, bf16, str(out), queue))
    proc.start()
    tps = queue.get(timeout=3600)
    proc.join(60)
    return {"tokens_per_s": tps}


JOBS = ("auto", "fp32", "bf16", "plain_fp32", "plain_bf16")


def run_shape(shape: Shape, model_dir: Path, data: Path, work: Path, steps: int, rounds: int,
              peaks: dict[str, float], params: int, jobs: tuple[str, ...] = JOBS) -> dict[str, Any]:
    runs: dict[str, list[dict]] = {k: [] for k in jobs}
    cache = work / f"cache-{shape.name}"
    for round_ in range(rounds):
        order = jobs if round_ % 2 == 0 else tuple(reversed(jobs))  # alternate who goes first
        for name in order:
            out = work / f"{shape.name}-{name}-{round_}"
            if name.startswith("plain_"):
                runs[name].append(plain_job(model_dir, data, shape, steps, name == "plain_bf16", out))
            else:
                # the last auto job of a LoRA shape is stopped with a save: its adapter is loaded with plain peft
                save = name == "auto" and shape.training_type == "lora" and round_ == rounds - 1
                runs[name].append(tunestudio_job(model_dir, data, shape, steps, name, out, cache, save))
            print(f"{shape.name} round {round_ + 1} {name:>10}: {runs[name][-1]['tokens_per_s']:8.1f} tok/s "
                  f"(load {os.getloadavg()[0]:.1f})", flush=True)
    best = {k: max(r["tokens_per_s"] for r in v) for k, v in runs.items()}
    faster_fixed = max((k for k in ("fp32", "bf16") if k in best), key=best.__getitem__)
    decision = runs["auto"][0]["decision"]
    auto_precision = decided_precision(decision)
    plain = max((best[k] for k in ("plain_fp32", "plain_bf16") if k in best), default=None)
    # the same ratio round by round (each round's jobs ran back to back): how much of it is noise
    by_round = [round(a["tokens_per_s"] / f["tokens_per_s"], 3)
                for a, f in zip(runs["auto"], runs[faster_fixed], strict=True)]
    mfu = {k: 6 * params * v / peaks["bf16" if k.endswith("bf16") or (k == "auto" and auto_precision == "bf16")
                                        else "fp32"] for k, v in best.items()}
    result = {
        "shape": shape.name, "tokens_per_s": {k: round(v, 1) for k, v in best.items()},
        "auto_chose": auto_precision, "decision": decision, "faster_fixed": faster_fixed,
        "auto_over_faster_fixed": round(best["auto"] / best[faster_fixed], 3),
        "auto_over_faster_fixed_by_round": by_round,
        "defaults_over_best_plain": round(best["auto"] / plain, 3) if plain else None,
        "mfu": {k: round(v, 4) for k, v in mfu.items()},
        "loss": [runs["auto"][0]["first_loss"], runs["auto"][0]["last_loss"]],
        "peak_memory_mb": runs["auto"][-1]["peak_memory_mb"], "notes": runs["auto"][0]["notes"],
    }
    result["met"] = result["auto_over_faster_fixed"] >= 0.95 and (plain is None
                                                                   or result["defaults_over_best_plain"] >= 0.97)
    if shape.training_type == "lora":
        result["plain_peft"] = load_with_plain_peft(model_dir, runs["auto"][-1]["output_dir"], data, shape.seq)
        print(f"{shape.name}: adapter loaded with plain peft: {result['plain_peft']}", flush=True)
        result["met"] = result["met"] and result["plain_peft"]["ok"]
    result["loss_fell"] = result["loss"][1] < result["loss"][0]
    print(f"{shape.name}: auto chose {auto_precision} ({decision})")
    print(f"{shape.name}: auto / faster fixed ({faster_fixed}) {result['auto_over_faster_fixed']:.3f} (>= 0.95; "
          f"round by round {by_round}); defaults / best plain {result['defaults_over_best_plain']} (>= 0.97); MFU "
          + ", ".join(f"{k} {v:.1%}" for k, v in mfu.items()), flush=True)
    return result


def main() -> None:
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=128_256)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--jobs", default=",".join(JOBS), help="a subset of " + ",".join(JOBS) + " (auto always)")
    parser.add_argument("--model", type=Path, help="a model folder (config.json, weights, tokenizer) to train "
                        "instead of the locally built one: a real pretrained model, downloaded beforehand")
    args = parser.parse_args()
    jobs = tuple(j for j in JOBS if j == "auto" or j in args.jobs.split(","))
    if len(jobs) < 2 or not {"fp32", "bf16"} & set(jobs):
        parser.error("--jobs: auto and at least one of fp32, bf16")
    work = Path(tempfile.mkdtemp(prefix="bench-precision-"))
    model_dir = args.model.resolve() if args.model else build_model(work, args.vocab)
    if not (model_dir / "config.json").is_file():
        parser.error(f"--model: {model_dir} has no config.json")
    short = REPO / "examples" / "data" / "prompt_completion.jsonl"
    long = write_long_texts(work)
    peaks = {"fp32": matmul_peak(torch.float32), "bf16": matmul_peak(torch.bfloat16)}
    from tunestudio.estimate import Shape, memory

    config = json.loads((model_dir / "config.json").read_text())
    params = memory(config).parameters
    vocab = Shape.of(config).vocab
    print(f"model: {model_dir.name}, {params / 1e6:.0f}M parameters, vocab {vocab}; {args.steps} steps, "
          f"{args.rounds} rounds; "
          f"matmul peak fp32 {peaks['fp32'] / 1e9:.0f}, bf16 {peaks['bf16'] / 1e9:.0f} GFLOP/s", flush=True)
    results = [run_shape(SHAPES[name], model_dir, short if SHAPES[name].seq <= 128 else long, work, args.steps,
                         args.rounds, peaks, params, jobs) for name in args.shapes.split(",")]
    print(json.dumps({"bench": "precision", "model": str(model_dir), "params": params, "vocab": vocab,
                      "steps": args.steps,
                      "rounds": args.rounds, "peak_gflops": {k: round(v / 1e9) for k, v in peaks.items()},
                      "shapes": results, "met": all(r["met"] for r in results)}))


if __name__ == "__main__":
    main()
