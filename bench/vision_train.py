"""Image-job training throughput: the tunestudio worker (its defaults) against a plain TRL script (issue 42).

The same vision-language model is LoRA-tuned on the same rows (examples/data/shapes.jsonl, the bundled shapes
pictures, one image a row, in the Hugging Face layout), two ways, each in a fresh process of its own:

  (a) plain: a hand-written TRL `SFTTrainer` script (this file run with --plain-child): the processor as
      `processing_class`, rows as {"images": [PIL], "messages": [...]}, so TRL picks its
      DataCollatorForVisionLanguageModeling; LoRA r/alpha as the studio's, on every linear layer but lm_head (the
      names the studio's `vision_layers.targets` picks with its default switches: checked), fp32, use_cpu;
  (b) worker: a tunestudio job (is_dataset_image, LoRA, the same batch, steps, max length, rank and alpha), the
      rest its defaults (precision auto, gradient checkpointing auto, image size = the tower's, no splitting),
      driven through `tunestudio.jobs.supervisor.Supervisor` as `tunestudio train` does.

Both count alike: TRL's num_tokens (image tokens included) and the images in the batches at the last training log,
over the seconds from `on_train_begin` to that log (the worker's last Progress event; a callback with the same rule
in the plain script); peak memory is the training process's ru_maxrss at that log; CPU seconds a step (between the
first and last logs) measure the work whatever the neighbours do. Both sides get the same torch threads
(TUNESTUDIO_TORCH_THREADS and OMP_NUM_THREADS). Runs alternate (a, b, a, b, ...); medians are compared.

Two models: models/tiny-smolvlm (64-px images, 4 image tokens) and a real-shaped one built here: SmolVLM-256M-
Instruct's published configuration with random weights (`build_real`), 512-px images, 64 image tokens each.

    /work/runtest .venv/bin/python bench/vision_train.py [--rounds 2] [--models tiny,real] [--declared-steps N]

Target (issue 42): (b) >= 1.0 x (a) with the studio's defaults. Ends with one JSON line. Heavy imports live inside
functions: the worker's "spawn" child re-imports this file as `__mp_main__`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # worker_overhead's CPU accounting

from worker_overhead import _snapshot as snapshot  # noqa: E402
from worker_overhead import cpu_since, process_cpu_s, wait_for_quiet  # noqa: E402

DATA = ROOT / "examples" / "data" / "shapes.jsonl"
TINY = ROOT / "models" / "tiny-smolvlm"
TARGET = 1.0
SEED = 3407  # JobConfig's default random_seed
LEARNING_RATE = 2e-4  # JobConfig's default


@dataclass(frozen=True)
class Shape:  # one model's run: what both sides train with
    name: str
    steps: int
    batch_size: int
    max_length: int = 256  # rows are 20-30 text tokens + the image's (4 tiny, 64 real): nothing is cut
    lora_r: int = 16  # JobConfig's defaults
    lora_alpha: int = 16
    # --declared-steps: the max_steps both sides are given, both stopped after `steps` (0: `steps`). A job that
    # long lets precision auto measure fp32 against bf16, as on a real job (a few steps never repay it: fp32)
    declared: int = 0

    @property
    def max_steps(self) -> int:
        return self.declared or self.steps


# The real-shaped model takes ~12 s a step at batch 2 on one thread: a few steps keep the bench under ~8 minutes.
SHAPES = {"tiny": Shape("tiny", steps=60, batch_size=8), "real": Shape("real", steps=4, batch_size=2)}


@dataclass
class Run:
    side: str  # "plain" or "worker"
    # at each training log: TRL's num_tokens, images so far, s since train begin, the process's CPU s (user + sys)
    logs: list[tuple[int, int, float, float]]
    peak_rss_mb: float  # the training process's ru_maxrss at the last log
    loss: float | None
    marks: list[tuple[str, float]]  # (what had finished, seconds since the process was started): where the wall went
    precision: str = "fp32"
    others: float = 0.0  # the share of the machine other processes took during the run
    params: int = 0  # the base model's, counted by the plain script

    tokens = property(lambda self: self.logs[-1][0])
    images = property(lambda self: self.logs[-1][1])
    seconds = property(lambda self: self.logs[-1][2])
    wall_s = property(lambda self: self.marks[-1][1])
    tokens_per_s = property(lambda self: self.tokens / self.seconds)  # the figure
    images_per_s = property(lambda self: self.images / self.seconds)

    # between the first and the last log (the first step's warm-up left out): tokens/s, and the CPU seconds a step,
    # the work done whatever the neighbours do (on one torch thread; more threads add their spinning)
    steady_tokens_per_s = property(lambda self: (self.tokens - self.logs[0][0]) / (self.seconds - self.logs[0][2]))
    cpu_per_step = property(lambda self: (self.logs[-1][3] - self.logs[0][3]) / (len(self.logs) - 1))

    def phases(self) -> str:
        times = [0.0] + [t for _, t in self.marks]
        return ", ".join(f"{name} {b - a:.1f}" for (name, _), a, b in zip(self.marks, times, times[1:], strict=False))


# --- the real-shaped model ------------------------------------------------------------
def _tokenizer(vocab_size: int) -> Any:
    """A byte-level BPE trained on the demo's words, its vocabulary filled to `vocab_size` with unused entries
    (never produced: no merge makes them), so the embedding and the output layer have the real model's size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from tunestudio.worker.tiny_vision import SMOLVLM_TEMPLATE

    special = ["<|pad|>", "<|bos|>", "<end_of_utterance>", "<fake_token_around_image>", "<image>", "<global-img>",
               *[f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]]
    texts = [line for line in DATA.read_text().splitlines() if line] + ["User: Assistant: System:"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=2048, special_tokens=special, show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    spec = json.loads(bpe.to_str())
    vocab = spec["model"]["vocab"]
    for i in range(max(vocab.values()) + 1, vocab_size):
        vocab[f"<unused_{i}>"] = i
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)), bos_token="<|bos|>",
                                        eos_token="<end_of_utterance>", pad_token="<|pad|>",
                                        extra_special_tokens={"image_token": "<image>"})
    tokenizer.chat_template = SMOLVLM_TEMPLATE
    tokenizer.model_max_length = 8192
    assert len(tokenizer) == vocab_size, len(tokenizer)
    return tokenizer


def build_real(directory: Path) -> int:
    """SmolVLM-256M-Instruct's shape, random weights, saved with its processor; returns the parameter count.

    Source: HuggingFaceTB/SmolVLM-256M-Instruct, config.json (Idefics3 architecture). Vision (SigLIP): hidden 768,
    intermediate 3072, 12 layers, 12 heads, patch 16, image_size 512. Text (Llama): hidden 576, intermediate
    1536, 30 layers, 9 heads, 3 key/value heads (head_dim 64), vocab 49280, rope theta 100000, max positions 8192,
    rms_norm_eps 1e-5, word embeddings not tied (256M parameters only untied). scale_factor 4: a 512-px image is
    (512/16)^2 / 4^2 = 64 image tokens. Its processor as the hub's, except no splitting and longest edge 512 (the
    studio's CPU defaults, which the plain script gets from the saved processor).
    """
    import torch
    from transformers import SmolVLMConfig, SmolVLMForConditionalGeneration, SmolVLMImageProcessorPil, SmolVLMProcessor
    from transformers.models.smolvlm.video_processing_smolvlm import SmolVLMVideoProcessor

    from tunestudio.worker.modalities.vision_compat import allow_missing_video
    from tunestudio.worker.tiny_vision import SMOLVLM_TEMPLATE

    allow_missing_video()
    tokenizer = _tokenizer(49280)
    config = SmolVLMConfig(
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"), scale_factor=4, tie_word_embeddings=False,
        vision_config={"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                       "num_attention_heads": 12, "image_size": 512, "patch_size": 16},
        text_config={"model_type": "llama", "vocab_size": 49280, "hidden_size": 576, "intermediate_size": 1536,
                     "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
                     "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 100000.0},
                     "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
                     "pad_token_id": tokenizer.pad_token_id},
    )
    torch.manual_seed(0)
    model = SmolVLMForConditionalGeneration(config)
    processor = SmolVLMProcessor(
        image_processor=SmolVLMImageProcessorPil(do_image_splitting=False, size={"longest_edge": 512},
                                              max_image_size={"longest_edge": 512}),
        tokenizer=tokenizer, video_processor=SmolVLMVideoProcessor(), image_seq_len=64,
        chat_template=SMOLVLM_TEMPLATE)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


# --- (a) the plain TRL script, in a child process -------------------------------------------
def plain_child(model_dir: Path, shape: Shape, out: Path) -> None:
    """What a user would write for an image dataset; its figures go to `out` as JSON (times: time.time())."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from trl import SFTConfig, SFTTrainer

    from tunestudio.config import JobConfig
    from tunestudio.worker.modalities.vision_compat import allow_missing_video
    from tunestudio.worker.train.vision_layers import targets

    marks = [("start", time.time())]
    allow_missing_video()  # no torchvision here: the processor needs this to build (vision_compat.py says why)
    rows = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    for row in rows:
        row["images"] = [Image.open(DATA.parent / p).convert("RGB") for p in row["images"]]
    dataset = Dataset.from_list(rows)
    marks.append(("data", time.time()))
    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
    params = sum(p.numel() for p in model.parameters())
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and not n.endswith("lm_head")]
    studio = targets(model, JobConfig(model_name="m", local_datasets=["d"], output_dir="o", is_dataset_image=True))
    if sorted(studio) != sorted(names):  # the studio's choice with its default switches
        raise SystemExit(f"LoRA targets differ: plain {len(names)}, studio {len(studio)}")
    marks.append(("model", time.time()))

    meter = _meter(shape, marks)
    trainer = SFTTrainer(
        model=model, processing_class=processor, train_dataset=dataset, callbacks=[meter],
        peft_config=LoraConfig(r=shape.lora_r, lora_alpha=shape.lora_alpha, lora_dropout=0.0, target_modules=names,
                               bias="none", task_type="CAUSAL_LM"),
        args=SFTConfig(output_dir=str(out.parent / f"{out.stem}-out"), max_steps=shape.max_steps,
                       per_device_train_batch_size=shape.batch_size, learning_rate=LEARNING_RATE,
                       max_length=shape.max_length, seed=SEED, data_seed=SEED, logging_steps=1, save_strategy="no",
                       report_to=[], disable_tqdm=True, use_cpu=True,
                       bf16=False, fp16=False,  # SFTConfig turns bf16 on by default, even on a CPU
                       activation_checkpointing=False),  # SFTConfig's default is on: slower, not the best plain
    )
    trainer.train()
    marks.append(("train", meter.last.pop("trained")))
    trainer.save_model()  # what a user's script ends with (the worker saves too)
    marks.append(("save", time.time()))
    out.write_text(json.dumps({**meter.last, "logs": meter.logs, "marks": marks, "params": params,
                               "threads": torch.get_num_threads()}))


def _meter(shape: Shape, marks: list[tuple[str, float]]) -> Any:
    """The plain script's clock: the worker's rule (num_tokens and seconds since on_train_begin at each log)."""
    import resource

    from transformers import TrainerCallback

    class Meter(TrainerCallback):  # also stops a declared-longer job after shape.steps, as the worker is stopped
        def __init__(self) -> None:
            self.t0, self.logs, self.last = time.monotonic(), [], {}

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.t0 = time.monotonic()
            marks.append(("trainer", time.time()))

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "loss" in logs:  # one image a row: the images are the rows trained
                use = resource.getrusage(resource.RUSAGE_SELF)
                self.logs.append((int(logs["num_tokens"]), state.global_step * shape.batch_size,
                                  time.monotonic() - self.t0, use.ru_utime + use.ru_stime))
                self.last = {"loss": logs["loss"], "trained": time.time(),
                             "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
                if state.global_step >= shape.steps:
                    control.should_training_stop = True

    return Meter()


def run_plain(model_dir: Path, shape: Shape, work: Path, i: int) -> Run:
    out, log = work / f"plain-{shape.name}-{i}.json", work / f"plain-{shape.name}-{i}.log"
    started = time.time()
    with log.open("w") as fh:
        code = subprocess.call([sys.executable, __file__, "--plain-child", str(model_dir), "--shape", shape.name,
                                "--declared-steps", str(shape.declared), "--out", str(out)],
                               stdout=fh, stderr=subprocess.STDOUT)
    ended = time.time()
    if code != 0 or not out.exists():
        raise RuntimeError(f"plain run failed ({code}):\n{log.read_text(errors='replace')[-3000:]}")
    r = json.loads(out.read_text())
    if r["threads"] != int(os.environ["OMP_NUM_THREADS"]):
        raise RuntimeError(f"plain run had {r['threads']} torch threads")
    marks = [(name, t - started) for name, t in r["marks"]] + [("exit", ended - started)]
    return Run("plain", [tuple(x) for x in r["logs"]], r["peak_rss_mb"], r["loss"], marks, params=r["params"])


# --- (b) the tunestudio worker -----------------------------------------------------------
def run_worker(model_dir: Path, shape: Shape, work: Path, i: int) -> Run:
    from tunestudio.config import JobConfig
    from tunestudio.events import Log, Phase, Progress
    from tunestudio.jobs.supervisor import Supervisor

    cfg = JobConfig(model_name=str(model_dir), local_datasets=[str(DATA)], output_dir=str(work / f"worker-{i}"),
                    is_dataset_image=True, training_type="lora", max_steps=shape.max_steps, batch_size=shape.batch_size,
                    gradient_accumulation_steps=1, max_seq_length=shape.max_length, lora_r=shape.lora_r,
                    lora_alpha=shape.lora_alpha, random_seed=SEED, learning_rate=LEARNING_RATE)
    events: list[Any] = []
    cpu: dict[int, float] = {}  # step → the worker's CPU seconds when its Progress event arrived
    stopped: list[None] = []

    def on_events(batch: list[Any]) -> None:
        events.extend(batch)
        steps = [e.step for e in batch if isinstance(e, Progress) and e.loss is not None]
        if steps and (used := process_cpu_s(sup.pid)) is not None:
            cpu.update(dict.fromkeys(steps, used))
        if shape.declared and steps and max(steps) >= shape.steps and not stopped:
            stopped.append(sup.stop(save=False))  # once: the worker ends at the next step boundary

    log_path, started = work / f"worker-{shape.name}-{i}.log", time.time()
    # a fresh cache each run: every run is a first job on the model (precision auto measures, if it pays)
    sup = Supervisor(cfg, on_events, log_path=log_path, cache_dir=str(work / f"cache-{shape.name}-{i}"))
    sup.start()
    outcome = sup.wait(1200)
    ended = time.time()
    if outcome is None or outcome.kind != ("cancelled" if shape.declared else "completed"):
        raise RuntimeError(f"worker run did not complete: {outcome}\n{log_path.read_text(errors='replace')[-3000:]}")
    progress = [e for e in events if isinstance(e, Progress) and e.loss is not None][:shape.steps]
    logs = {e.message: e.ts for e in reversed(events) if isinstance(e, Log)}  # each message's first time
    phases = {e.phase: e.ts for e in reversed(events) if isinstance(e, Phase)}
    if not any(m.startswith("model: ") and m.endswith(f", {os.environ['TUNESTUDIO_TORCH_THREADS']} threads)")
               for m in logs):  # worker/main.py's line
        raise RuntimeError("the worker ran on other threads than asked")
    decided = [m for m in logs if m.startswith("precision auto → ")]  # worker/train/calibrate.py's line
    # where the wall went: the worker's own milestones (worker/main.py's phases and log lines)
    milestones = [("start", phases.get("loading_model")), ("model", phases.get("loading_dataset")),
                  ("data", next((t for m, t in logs.items() if m.startswith("dataset: ")), None)),
                  ("trainer+precision", logs.get(decided[0]) if decided else None),
                  ("base", phases.get("training")), ("train", progress[-1].ts), ("save+report", ended)]
    marks = [(name, t - started) for name, t in milestones if t is not None]
    steps = [(e.num_tokens or 0, e.step * shape.batch_size, e.elapsed_seconds or 0.0, cpu.get(e.step, 0.0))
             for e in progress]
    return Run("worker", steps, progress[-1].peak_memory_mb or 0.0, progress[-1].loss, marks,
               decided[0].split("→ ")[1].split()[0] if decided else "fp32")


# --- the benchmark ------------------------------------------------------------------------
def measured(fn: Any, *args: Any) -> Run:
    wait_for_quiet(5.0)
    start = snapshot()
    run = fn(*args)
    run.others = cpu_since(start).other_share
    print(f"    {run.side:<6} {run.tokens_per_s:8.1f} tok/s (steady {run.steady_tokens_per_s:8.1f})  "
          f"{run.images_per_s:6.2f} img/s  {run.tokens} tokens, {run.images} images in {run.seconds:6.2f} s  "
          f"{run.cpu_per_step:.3f} CPU s/step  peak RSS {run.peak_rss_mb:6.0f} MiB  loss {run.loss:.3f}  "
          f"{run.precision}  others {run.others:4.0%}\n           wall {run.wall_s:5.1f} s: {run.phases()}", flush=True)
    return run


def bench_model(shape: Shape, model_dir: Path, rounds: int, work: Path) -> dict[str, Any]:
    print(f"{shape.name}: {model_dir.name}, LoRA r={shape.lora_r} alpha={shape.lora_alpha} on every linear layer "
          f"but lm_head, {shape.steps} steps (of {shape.max_steps}), batch {shape.batch_size}, max_length "
          f"{shape.max_length}", flush=True)
    runs: dict[str, list[Run]] = {"plain": [], "worker": []}
    for i in range(rounds):  # alternating: a change in the machine's load falls on both sides alike
        print(f"  round {i + 1}", flush=True)
        runs["plain"].append(measured(run_plain, model_dir, shape, work, i))
        runs["worker"].append(measured(run_worker, model_dir, shape, work, i))
    every = runs["plain"] + runs["worker"]
    if len({tuple(log[0] for log in r.logs) for r in every}) != 1:
        print("  warning: the runs saw different tokens: " + "; ".join(
            f"{r.side} {[log[0] for log in r.logs]}" for r in every), flush=True)

    tps, steady, ips, rss, wall, cpu = ({side: statistics.median(getattr(r, what) for r in side_runs)
                                         for side, side_runs in runs.items()}
                                        for what in ("tokens_per_s", "steady_tokens_per_s", "images_per_s",
                                                     "peak_rss_mb", "wall_s", "cpu_per_step"))
    ratio = tps["worker"] / tps["plain"]
    print(f"  median: plain {tps['plain']:.1f} tok/s {ips['plain']:.2f} img/s {rss['plain']:.0f} MiB; worker "
          f"{tps['worker']:.1f} tok/s {ips['worker']:.2f} img/s {rss['worker']:.0f} MiB; ratio {ratio:.3f} "
          f"(target {TARGET}: {'met' if ratio >= TARGET else 'NOT met'}); steady-state ratio "
          f"{steady['worker'] / steady['plain']:.3f}; CPU s a step {cpu['plain']:.3f} vs {cpu['worker']:.3f} "
          f"({cpu['worker'] / cpu['plain']:.3f}x); wall {wall['plain']:.1f} s vs {wall['worker']:.1f} s", flush=True)

    def both(values: dict[str, float], digits: int = 1) -> dict[str, float]:
        return {side: round(v, digits) for side, v in values.items()}

    return {"params": runs["plain"][0].params, "settings": asdict(shape), "ratio": round(ratio, 3),
            "tokens_per_s": both(tps), "steady_tokens_per_s": both(steady),
            "steady_ratio": round(steady["worker"] / steady["plain"], 3), "images_per_s": both(ips, 3),
            "peak_rss_mb": both(rss, 0), "wall_s": both(wall), "cpu_s_per_step": both(cpu, 4),
            "cpu_ratio": round(cpu["worker"] / cpu["plain"], 3),
            "precision_worker": sorted({r.precision for r in runs["worker"]}),
            "round_ratios": [round(w.tokens_per_s / p.tokens_per_s, 3) for p, w in zip(*runs.values(), strict=True)],
            "tokens": sorted({r.tokens for r in every}), "others_share_max": round(max(r.others for r in every), 3),
            "met": ratio >= TARGET}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="rounds of (plain, worker) a model; medians reported")
    parser.add_argument("--models", default="tiny,real", help="tiny, real or both (comma-separated)")
    # One thread a side by default: on 2 shared cores a process on 2 threads ran 9x slower beside one busy
    # neighbour (bench/threads.py), which swamps what is measured here; --threads 2 on a quiet machine.
    parser.add_argument("--threads", type=int, default=1, help="torch threads on both sides (default 1)")
    parser.add_argument("--declared-steps", type=int, default=0, help="max_steps both sides are given (stopped "
                        "after the measured steps): a long job, where precision auto measures; 0: no more")
    parser.add_argument("--plain-child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--shape", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plain_child:
        return plain_child(args.plain_child, replace(SHAPES[args.shape], declared=args.declared_steps), args.out)
    for name in ("TUNESTUDIO_TORCH_THREADS", "OMP_NUM_THREADS"):  # inherited by both sides' processes
        os.environ[name] = str(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    started = time.monotonic()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-vision-") as tmp:
        for name in args.models.split(","):
            model_dir = TINY if name == "tiny" else Path(tmp) / "smolvlm-256m-shaped"
            if name == "real":
                build_real(model_dir)
            results[name] = bench_model(replace(SHAPES[name], declared=args.declared_steps), model_dir, args.rounds,
                                        Path(tmp))
    print(json.dumps({"bench": "vision_train", "threads": args.threads, "rounds": args.rounds, "target": TARGET,
                      "declared_steps": args.declared_steps, "met": all(r["met"] for r in results.values()),
                      "models": results,
                      "total_s": round(time.monotonic() - started, 1)}))


if __name__ == "__main__":
    main()
