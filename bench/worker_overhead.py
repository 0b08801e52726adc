"""Worker overhead: does training through tunestudio cost throughput?

The same locally built Llama (about 13M parameters, initialised from a seed and
saved with `save_pretrained`) is LoRA-tuned on the same data
(examples/data/alpaca.jsonl) with the same settings, two ways:

  (a) plain: a hand-written TRL `SFTTrainer` script, in this process;
  (b) worker: a tunestudio job, in its own spawned worker process, driven
      through `tunestudio.jobs.supervisor.Supervisor` as `tunestudio train` does.

Both sides are measured the same way: TRL's cumulative `num_tokens` at the last
training log divided by the seconds from `on_train_begin` to that log. For (b)
these are the `num_tokens` and `elapsed_seconds` of the worker's last Progress
event; for (a) a TrainerCallback built on the same rule. The runs alternate
(a, b, a, b, ...) and the medians are compared; the target is (b)/(a) >= 0.97.

The machine is shared and has 2 cores: before each run the script waits
(bounded) for other processes to go quiet, and it accounts for the CPU others
took during each run (/proc/stat). A round in which others took more than 10%
of the machine is repeated (bounded); the medians are over the quiet rounds.
Every run must see the same number of tokens (same data order), or it warns.

    .venv/bin/python bench/worker_overhead.py            # 3 rounds: a, b, a, b, a, b
    .venv/bin/python bench/worker_overhead.py --rounds 2 --steps 40   # quicker

The last line of output is one JSON object with the figures.

Heavy libraries are imported inside functions only: the worker is started with
multiprocessing "spawn", whose child re-imports this file as `__mp_main__`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "examples" / "data" / "alpaca.jsonl"
TARGET = 0.97
OTHERS_LIMIT = 0.10  # a run is "busy" when other processes took more than this share of the machine


@dataclass(frozen=True)
class Settings:
    """What both sides train with. The bundled rows are 16-22 tokens, so max_length never truncates."""

    seed: int = 3407
    max_length: int = 256
    batch_size: int = 16
    steps: int = 80
    learning_rate: float = 2e-4
    lr_scheduler_type: str = "linear"
    warmup_steps: int = 0
    weight_decay: float = 0.01
    optim: str = "adamw_torch"
    logging_steps: int = 1  # JobConfig's default: a Progress event every step
    lora_r: int = 16
    lora_alpha: int = 32
    # the benchmark model (Llama); ~13.4M parameters with the ~1k-token vocabulary
    hidden_size: int = 384
    intermediate_size: int = 1024
    num_hidden_layers: int = 8
    num_attention_heads: int = 6
    num_key_value_heads: int = 2


@dataclass
class Run:
    side: str  # "plain" or "worker"
    logs: list[tuple[int, float]]  # at each training log: TRL's cumulative num_tokens, seconds since on_train_begin
    final_loss: float | None
    wall_seconds: float  # the whole run: (a) load + build trainer + train; (b) spawn → worker exit
    cpu: CpuUse | None = None  # filled in by `measured`
    process_cpu_s: float | None = None  # the worker's CPU seconds, read from /proc as it reported its end

    @property
    def tokens(self) -> int:
        return self.logs[-1][0]

    @property
    def seconds(self) -> float:
        return self.logs[-1][1]

    @property
    def tokens_per_s(self) -> float:
        """The figure the issue asks for: num_tokens / (on_train_begin → last log)."""
        return self.tokens / self.seconds

    @property
    def steady_tokens_per_s(self) -> float:
        """Between the first and the last log: leaves out the first step's warm-up."""
        return (self.tokens - self.logs[0][0]) / (self.seconds - self.logs[0][1])

    def intervals(self) -> list[tuple[int, float]]:
        """(tokens, seconds) of each step between consecutive logs, the first step left out."""
        return [(t1 - t0, s1 - s0) for (t0, s0), (t1, s1) in zip(self.logs, self.logs[1:], strict=False)]


def best_of_runs(runs: list[Run]) -> float:
    """Tokens/s if every logged interval had gone as fast as in its fastest run.

    Other processes only ever slow a run down, in bursts; both sides train the very
    same batches in the same order, so interval k holds the same tokens in every run
    and its fastest time across runs is the least disturbed measurement of it.
    """
    per_run = [r.intervals() for r in runs]
    n = min(len(iv) for iv in per_run)
    tokens = sum(per_run[0][k][0] for k in range(n))
    seconds = sum(min(iv[k][1] for iv in per_run) for k in range(n))
    return tokens / seconds


# --- the machine ------------------------------------------------------------------
@dataclass(frozen=True)
class CpuUse:
    """CPU seconds over one run: this process, its waited-for children (the worker), and everything else."""

    wall_s: float
    parent_s: float
    child_s: float
    other_s: float  # busy time on the machine that was neither: other people's processes, the kernel, steal

    @property
    def other_share(self) -> float:
        """The share of the machine's capacity taken by others during the run (0: quiet)."""
        return self.other_s / (CORES * self.wall_s) if self.wall_s > 0 else 0.0


CORES = os.cpu_count() or 1
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _machine_busy_s() -> float:
    """Busy CPU seconds of the whole machine since boot (Linux /proc/stat), or 0 where there is none."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    return (user + nice + system + irq + softirq + steal) / _TICK


def _snapshot() -> tuple[float, float, float, float]:
    t = os.times()
    return time.monotonic(), t.user + t.system, t.children_user + t.children_system, _machine_busy_s()


def cpu_since(start: tuple[float, float, float, float], unwaited_child_s: float = 0.0) -> CpuUse:
    """unwaited_child_s: CPU of a worker that is not our own waited-for child (a forkserver's fork)."""
    end = _snapshot()
    wall, parent, child, busy = (b - a for a, b in zip(start, end, strict=True))
    child = max(child, unwaited_child_s)
    return CpuUse(wall, parent, child, max(busy - parent - child, 0.0) if busy else 0.0)


def process_cpu_s(pid: int) -> float | None:
    """utime + stime of a live process (Linux /proc), or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK


def wait_for_quiet(max_wait_s: float, busy_cores: float = 0.25) -> float:
    """Wait until other processes use under `busy_cores` cores (over 1 s), at most max_wait_s; returns the wait."""
    started = time.monotonic()
    while time.monotonic() - started < max_wait_s:
        before = _snapshot()
        time.sleep(1.0)
        use = cpu_since(before)
        if use.other_s + use.parent_s + use.child_s < busy_cores * use.wall_s:
            break
    return time.monotonic() - started


# --- the model ------------------------------------------------------------------
def build_tokenizer() -> Any:
    """The embedded tiny model's byte-level BPE tokenizer, built the same way (without its model pre-training)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from tunestudio.worker import tiny

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        [f"{tiny.alpaca_user_text(r)}\n{r['output']}" for r in tiny.make_rows()],
        trainers.BpeTrainer(
            vocab_size=1024,
            special_tokens=tiny.SPECIAL_TOKENS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<|bos|>", eos_token="<|end|>", pad_token="<|pad|>"
    )
    tokenizer.chat_template = tiny.CHAT_TEMPLATE
    tokenizer.model_max_length = 512
    return tokenizer


def build_model(directory: Path, settings: Settings) -> int:
    """Save a seeded Llama and its tokenizer to `directory` with save_pretrained; returns the parameter count."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=settings.hidden_size,
        intermediate_size=settings.intermediate_size,
        num_hidden_layers=settings.num_hidden_layers,
        num_attention_heads=settings.num_attention_heads,
        num_key_value_heads=settings.num_key_value_heads,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(settings.seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


# --- (a) the plain TRL script -----------------------------------------------------
def _meter() -> Any:
    from transformers import TrainerCallback

    class Meter(TrainerCallback):
        """Tokens and seconds at each training log, timed from on_train_begin (as the worker's callback does)."""

        def __init__(self) -> None:
            self.t0 = time.monotonic()
            self.logs: list[tuple[int, float]] = []
            self.loss: float | None = None

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.t0 = time.monotonic()

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
            logs = logs or {}
            if "loss" in logs and "num_tokens" in logs:
                self.logs.append((int(logs["num_tokens"]), time.monotonic() - self.t0))
                self.loss = logs["loss"]

    return Meter()


def run_plain(model_dir: Path, out_dir: Path, settings: Settings) -> Run:
    """What a user would write: load, format alpaca rows as chat prompt/completion, SFTTrainer with LoRA."""
    started = time.monotonic()
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)

    def to_chat(row: dict[str, str]) -> dict[str, Any]:
        user = f"{row['instruction']}\n\n{row['input']}" if row.get("input") else row["instruction"]
        return {
            "prompt": [{"role": "user", "content": user}],
            "completion": [{"role": "assistant", "content": row["output"]}],
        }

    with DATA.open(encoding="utf-8") as fh:
        dataset = Dataset.from_list([to_chat(json.loads(line)) for line in fh if line.strip()])

    args = SFTConfig(
        output_dir=str(out_dir),
        seed=settings.seed,
        max_steps=settings.steps,
        per_device_train_batch_size=settings.batch_size,
        gradient_accumulation_steps=1,
        learning_rate=settings.learning_rate,
        lr_scheduler_type=settings.lr_scheduler_type,
        warmup_steps=settings.warmup_steps,
        weight_decay=settings.weight_decay,
        optim=settings.optim,  # SFTConfig's default is adamw_torch_fused; tunestudio's is adamw_torch
        max_length=settings.max_length,
        bf16=False,  # SFTConfig turns bf16 on by default, even on CPU
        fp16=False,
        use_cpu=True,
        activation_checkpointing=False,  # SFTConfig's default is True; tunestudio's is False
        logging_steps=settings.logging_steps,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
    )
    peft_config = LoraConfig(
        r=settings.lora_r,
        lora_alpha=settings.lora_alpha,
        lora_dropout=0.0,
        target_modules="all-linear",
        bias="none",
        task_type="CAUSAL_LM",
    )
    meter = _meter()
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[meter],
    )
    # disable_tqdm makes the trainer print each log dict; it goes to a file, as the worker's does
    with (out_dir.parent / f"{out_dir.name}.log").open("w") as log, contextlib.redirect_stdout(log):
        trainer.train()
    wall = time.monotonic() - started
    if len(meter.logs) < 2:
        raise RuntimeError(f"plain run logged {len(meter.logs)} training records; need at least 2")
    return Run("plain", meter.logs, meter.loss, wall)


# --- (b) the tunestudio worker ------------------------------------------------------
def run_worker(model_dir: Path, out_dir: Path, settings: Settings, prewarm: bool = False) -> Run:
    """A tunestudio job with the same settings, in its supervised worker process.

    prewarm=False: a spawned interpreter (Supervisor's default); True: a fork of the
    prewarmed forkserver, as the JobManager (and so `tunestudio train`) starts workers.
    """
    from tunestudio.config import JobConfig
    from tunestudio.events import Completed, Event, Failed, Progress
    from tunestudio.jobs.supervisor import Supervisor

    cfg = JobConfig(
        model_name=str(model_dir),
        training_type="lora",
        local_datasets=[str(DATA)],
        format_type="alpaca",
        output_dir=str(out_dir),
        precision="fp32",
        random_seed=settings.seed,
        max_steps=settings.steps,
        batch_size=settings.batch_size,
        gradient_accumulation_steps=1,
        learning_rate=settings.learning_rate,
        lr_scheduler_type=settings.lr_scheduler_type,
        warmup_steps=settings.warmup_steps,
        weight_decay=settings.weight_decay,
        optim=settings.optim,
        max_seq_length=settings.max_length,
        gradient_checkpointing=False,
        logging_steps=settings.logging_steps,
        save_steps=0,
        eval_steps=0,
        lora_r=settings.lora_r,
        lora_alpha=settings.lora_alpha,
        lora_dropout=0.0,
        train_on_completions=True,  # what TRL does by default on prompt/completion data
    )
    events: list[Event] = []
    cpu_at_end: list[float] = []

    def on_events(batch: list[Event]) -> None:
        events.extend(batch)
        if any(isinstance(event, (Completed, Failed)) for event in batch) and supervisor.pid:
            # a forkserver's fork is not our child, so os.times() never counts it: read it while it lives
            cpu_at_end.extend(c for c in [process_cpu_s(supervisor.pid)] if c is not None)

    log_path = out_dir.parent / f"{out_dir.name}.log"
    started = time.monotonic()
    supervisor = Supervisor(cfg, on_events, log_path=log_path, prewarm=prewarm)
    supervisor.start()
    outcome = supervisor.wait(timeout=600)
    wall = time.monotonic() - started
    if outcome is None or outcome.kind != "completed":
        tail = log_path.read_text(errors="replace")[-3000:] if log_path.exists() else ""
        raise RuntimeError(f"worker run did not complete: {outcome}\n{tail}")
    logs = [
        e
        for e in events
        if isinstance(e, Progress) and e.loss is not None and e.num_tokens is not None and e.elapsed_seconds is not None
    ]
    if len(logs) < 2:
        raise RuntimeError(f"worker run sent {len(logs)} training Progress events; need at least 2")
    records = [(e.num_tokens or 0, e.elapsed_seconds or 0.0) for e in logs]
    return Run("worker", records, logs[-1].loss, wall, process_cpu_s=cpu_at_end[0] if cpu_at_end else None)


# --- the benchmark ------------------------------------------------------------------
def measured(fn: Any, *args: Any, quiet_wait_s: float) -> Run:
    """Run one side after waiting (bounded) for the machine to be quiet, and account for its CPU use."""
    waited = wait_for_quiet(quiet_wait_s)
    start = _snapshot()
    run = fn(*args)
    run.cpu = cpu_since(start, run.process_cpu_s or 0.0)
    _show(run, waited)
    return run


def _show(run: Run, waited: float) -> None:
    cpu = run.cpu
    assert cpu is not None
    busy = f"cpu: parent {cpu.parent_s / cpu.wall_s:.2f} + child {cpu.child_s / cpu.wall_s:.2f} cores"
    print(
        f"  {run.side:<6}  {run.tokens_per_s:7.0f} tok/s  (steady {run.steady_tokens_per_s:7.0f})  "
        f"{run.tokens} tokens in {run.seconds:6.2f} s  loss {run.final_loss:.3f}  wall {run.wall_seconds:5.1f} s  "
        f"{busy}; others {cpu.other_share:4.0%} of the machine" + (f" (waited {waited:.0f} s)" if waited > 1.5 else ""),
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of (plain, worker) to measure; medians reported")
    parser.add_argument("--steps", type=int, default=Settings.steps)
    parser.add_argument(
        "--quiet-wait", type=float, default=10.0, help="at most this many seconds to wait for a quiet machine per run"
    )
    parser.add_argument(
        "--max-others",
        type=float,
        default=OTHERS_LIMIT,
        help="a round in which other processes took more than this share of the machine is repeated",
    )
    parser.add_argument("--extra-rounds", type=int, default=3, help="at most this many repeated rounds")
    parser.add_argument(
        "--prewarm", action="store_true", help="start the worker from the prewarmed forkserver (the JobManager's way)"
    )
    parser.add_argument("--budget", type=float, default=240.0, help="no repeated round starts after this many seconds")
    opts = parser.parse_args(argv)
    settings = Settings(steps=opts.steps)

    import logging
    import warnings

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the worker sets the same
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    warnings.filterwarnings("ignore", message=".*kernels.*")
    import datasets
    import torch
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_warning()
    logging.getLogger("transformers").setLevel(logging.WARNING)

    started = time.monotonic()
    rounds: list[tuple[Run, Run]] = []
    with tempfile.TemporaryDirectory(prefix="tunestudio-bench-") as tmp:
        model_dir = Path(tmp) / "bench-llama"
        params = build_model(model_dir, settings)
        if opts.prewarm:
            from tunestudio.jobs import prewarm

            prewarm.warm_up().join()  # as the JobManager does at start; its imports then finish before round 1
        print(
            f"worker_overhead: {params:,}-parameter Llama, LoRA r={settings.lora_r} all-linear, "
            f"{settings.steps} steps, batch {settings.batch_size}, max_length {settings.max_length}, fp32, "
            f"{CORES} CPUs, torch threads {torch.get_num_threads()} (this process)",
            flush=True,
        )

        def clean(pair: tuple[Run, Run]) -> bool:
            return all(r.cpu is not None and r.cpu.other_share <= opts.max_others for r in pair)

        while True:
            n_clean = sum(clean(pair) for pair in rounds)
            if n_clean >= opts.rounds:
                break
            if len(rounds) >= opts.rounds and (
                len(rounds) >= opts.rounds + opts.extra_rounds or time.monotonic() - started > opts.budget
            ):
                break
            i = len(rounds)
            print(f"round {i + 1}" + (" (repeating a busy round)" if i >= opts.rounds else ""), flush=True)
            plain = measured(run_plain, model_dir, Path(tmp) / f"plain-{i}", settings, quiet_wait_s=opts.quiet_wait)
            worker = measured(
                run_worker, model_dir, Path(tmp) / f"worker-{i}", settings, opts.prewarm, quiet_wait_s=opts.quiet_wait
            )
            rounds.append((plain, worker))

    kept = [pair for pair in rounds if clean(pair)]
    if not kept:
        print(
            f"warning: other processes took more than {opts.max_others:.0%} of the machine in every round; "
            "the figures below are from a busy machine",
            file=sys.stderr,
        )
        kept = rounds
    plains = [plain for plain, _ in kept]
    workers = [worker for _, worker in kept]
    runs = plains + workers
    if len({tuple(t for t, _ in r.logs) for r in runs}) != 1:
        print(f"warning: the runs saw different tokens: {sorted({r.tokens for r in runs})}", file=sys.stderr)
    tps_plain = statistics.median(r.tokens_per_s for r in plains)
    tps_worker = statistics.median(r.tokens_per_s for r in workers)
    steady_plain = statistics.median(r.steady_tokens_per_s for r in plains)
    steady_worker = statistics.median(r.steady_tokens_per_s for r in workers)
    ratio = tps_worker / tps_plain
    best_plain, best_worker = best_of_runs(plains), best_of_runs(workers)
    others = max(r.cpu.other_share for r in runs if r.cpu)
    print(
        f"median tokens/s over {len(kept)} of {len(rounds)} rounds: plain {tps_plain:.0f}, worker {tps_worker:.0f}; "
        f"ratio {ratio:.3f} (target {TARGET}: {'met' if ratio >= TARGET else 'NOT met'}); "
        f"steady-state ratio {steady_worker / steady_plain:.3f}; "
        f"best-of-runs per step: plain {best_plain:.0f}, worker {best_worker:.0f}, "
        f"ratio {best_worker / best_plain:.3f}",
        flush=True,
    )

    def per_run(side: list[Run]) -> list[float]:
        return [round(r.tokens_per_s, 1) for r in side]

    result = {
        "bench": "worker_overhead",
        "tokens_per_s_plain": round(tps_plain, 1),
        "tokens_per_s_worker": round(tps_worker, 1),
        "ratio": round(ratio, 4),
        "target": TARGET,
        "steady_tokens_per_s_plain": round(steady_plain, 1),
        "steady_tokens_per_s_worker": round(steady_worker, 1),
        "steady_ratio": round(steady_worker / steady_plain, 4),
        "best_tokens_per_s_plain": round(best_plain, 1),
        "best_tokens_per_s_worker": round(best_worker, 1),
        "best_ratio": round(best_worker / best_plain, 4),
        "runs_tokens_per_s_plain": per_run(plains),
        "runs_tokens_per_s_worker": per_run(workers),
        "round_ratios": [round(w.tokens_per_s / p.tokens_per_s, 4) for p, w in kept],
        "wall_s_plain": round(statistics.median(r.wall_seconds for r in plains), 2),
        "wall_s_worker": round(statistics.median(r.wall_seconds for r in workers), 2),
        "worker_start": "forkserver (prewarmed)" if opts.prewarm else "spawn",
        "rounds": len(kept),
        "rounds_run": len(rounds),
        "others_share_max": round(others, 3),
        "tokens": runs[-1].tokens,
        "params": params,
        "cpus": CORES,
        "settings": asdict(settings),
        "total_s": round(time.monotonic() - started, 1),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
