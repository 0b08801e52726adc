"""What only a CUDA GPU can show (issue 18), in one run of under 8 minutes on one H200.

A locally built Llama of a real shape (~135M parameters: hidden 576, 12 layers,
9 heads, 3 KV heads, intermediate 1536, vocabulary 128256, tied embeddings;
random weights: the shapes, not the values, decide speed and memory), trained
through the real worker (`Supervisor`, one process per job: spawned on the GPU, forked from
the prewarmed forkserver in the CPU smoke, where the imports are then paid once), on
examples/data/prompt_completion.jsonl. The checks, each bounded in time; one that
fails is recorded and the next runs:

  a. qlora     QLoRA (bitsandbytes nf4), 30 steps: the loss falls; tokens/s; peak memory.
  b. precision LoRA in fp32, bf16 and `precision: auto` (declared 20,000 steps so the worker
               calibrates, stopped after STEADY_STEPS logged steps): the "precision auto → …" line,
               steady tokens/s of each; auto ≥ 0.95 × the faster fixed precision.
  c. memory    Progress.peak_memory_mb is CUDA's max_memory_allocated: above the weights, below
               what nvidia-smi says the worker's process holds, and not its resident set size.
  d. oom       a full fine-tune whose activations need over twice the GPU (batch sized from
               torch.cuda.mem_get_info): it fails fast with "out of GPU memory: …" and the advice.
  e. hardware  tunestudio.api.hardware lists the GPU by name (nvidia-smi).

    .venv/bin/python bench/gpu.py              # on a CUDA machine; elsewhere one line, exit 0
    .venv/bin/python bench/gpu.py --cpu-smoke  # the same code on this CPU: tiny models, a few steps

Every check prints its figures; the run ends with one JSON line of all of them.
On a CPU (--cpu-smoke) the memory-error check caps the worker's address space
(RLIMIT_AS, 4 GiB) and sizes the job to twice that: the CPU's "out of memory: …".
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DATA = REPO / "examples" / "data" / "prompt_completion.jsonl"
ADVICE = ("batch_size", "gradient_accumulation_steps", "max_seq_length", "gradient_checkpointing: true",
          "training_type: qlora")


@dataclass(frozen=True)
class Shape:
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    positions: int
    tied: bool = True


@dataclass(frozen=True)
class Plan:
    """The sizes of one run: the real one on a GPU, a small one for the CPU smoke."""

    model: Shape
    oom_model: Shape | None  # None: check d uses the main model
    seq: int
    batch: int
    qlora_steps: int
    steady_steps: int  # logged steps before a precision job is stopped
    oom_seq: int
    budget_s: float  # the whole run, checks and model building together
    job_bound_s: float  # one job, start to end


GPU_PLAN = Plan(model=Shape(128_256, 576, 1536, 12, 9, 3, 4096), oom_model=None, seq=128, batch=8,
                qlora_steps=30, steady_steps=100, oom_seq=4096, budget_s=420, job_bound_s=120)
# The smoke's memory-error model: narrow (little compute per token), a wide MLP (much memory per token).
SMOKE_PLAN = Plan(model=Shape(1024, 64, 128, 2, 4, 2, 512), oom_model=Shape(1024, 64, 65_536, 1, 4, 2, 512),
                  seq=64, batch=4, qlora_steps=4, steady_steps=3, oom_seq=512, budget_s=240, job_bound_s=90)


@dataclass
class Bench:
    work: Path
    cuda: bool
    plan: Plan
    deadline: float  # time.monotonic() by which every check has ended
    model_dir: Path | None = None
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)  # each job's figures, for later checks

    def left(self) -> float:
        return self.deadline - time.monotonic()


# --- the model and the data ----------------------------------------------------------------------------------
def tokenizer_dir(work: Path) -> Path:
    """The embedded tiny model's folder (its byte-level tokenizer): the one `make` built, else built here."""
    built = REPO / "models" / "tiny-llama"
    if (built / "tokenizer.json").is_file():
        return built
    from tunestudio.worker.tiny import build_tiny_model

    return build_tiny_model(work / "tiny")


def build_model(work: Path, shape: Shape, name: str) -> Path:
    """A random Llama of `shape` with the tiny tokenizer (its ids stay below any vocabulary here), saved."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir(work))
    config = LlamaConfig(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                         num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                         num_key_value_heads=shape.kv_heads, max_position_embeddings=shape.positions,
                         tie_word_embeddings=shape.tied, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    out = work / name
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def weights_mb(model_dir: Path) -> float:
    return sum(p.stat().st_size for p in model_dir.glob("*.safetensors")) / 2**20


def long_rows(model_dir: Path, seq: int, rows: int, path: Path) -> Path:
    """`rows` plain-text rows of at least `seq` tokens each (cut to `seq` by the job)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    words = [w for line in DATA.read_text().splitlines() for w in json.loads(line)["prompt"].split()]
    rng = random.Random(0)
    text = ""
    while len(tokenizer(text).input_ids) < seq + 8:
        text += " ".join(rng.choice(words) for _ in range(max(8, seq // 4))) + " "
    path.write_text("".join(json.dumps({"text": text}) + "\n" for _ in range(rows)))
    return path


# --- one job through the real worker ---------------------------------------------------------------------------
def run_job(
    bench: Bench, name: str, fields: dict[str, Any], *, stop_after: int | None = None,
    on_start: Callable[[int], None] | None = None, watch: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """One job to its end; stopped (save=False) after `stop_after` logged steps or at its time bound.

    The events are polled from this thread with a deadline. `on_start(pid)` runs once the worker exists,
    `watch(pid)` at each poll once it trains. Returns the outcome and the figures.
    """
    from tunestudio.config import JobConfig
    from tunestudio.events import Progress
    from tunestudio.jobs.supervisor import Supervisor

    assert bench.model_dir is not None
    base: dict[str, Any] = {
        "model_name": str(bench.model_dir), "local_datasets": [str(DATA)], "output_dir": str(bench.work / name),
        "training_type": "lora", "batch_size": bench.plan.batch, "gradient_accumulation_steps": 1,
        "learning_rate": 1e-3, "max_seq_length": bench.plan.seq, "random_seed": 7, "lora_r": 16,
        "lora_alpha": 32, "logging_steps": 1, "gradient_checkpointing": False,
    }
    cfg = JobConfig.model_validate({**base, **fields})
    events: list[Any] = []
    lock = threading.Lock()

    def on_events(batch: list[Any]) -> None:
        with lock:
            events.extend(batch)

    bound = min(bench.plan.job_bound_s, bench.left() - 10)
    if bound < 20:
        raise TimeoutError(f"{bound + 10:.0f} s left in the run: not started")
    log_path = bench.work / f"{name}.log"
    # The CPU smoke forks its jobs from the prewarmed forkserver (its imports paid once); on a GPU each job is
    # spawned, as the studio's are there (jobs/prewarm.py: a fork after CUDA's start cannot use CUDA).
    sup = Supervisor(cfg, on_events, cache_dir=str(bench.work / "cache"), log_path=log_path, prewarm=not bench.cuda,
                     stop_grace_seconds=10, kill_after_seconds=5)
    started = time.monotonic()
    sup.start()
    if on_start is not None and sup.pid is not None:
        on_start(sup.pid)
    stopped_because = None
    while (outcome := sup.wait(0.25)) is None:
        elapsed = time.monotonic() - started
        with lock:
            steps = sum(isinstance(e, Progress) and e.loss is not None for e in events)
        if watch is not None and sup.pid is not None and steps > 0:  # memory sampled once training holds it
            watch(sup.pid)
        if stopped_because is None:
            if stop_after is not None and steps >= stop_after:
                stopped_because = f"{steps} steps"
            elif elapsed > bound:
                stopped_because = f"time bound {bound:.0f} s"
            if stopped_because is not None:
                sup.stop(save=False)
        elif elapsed > bound + 30:
            break  # the supervisor's escalation (10 s, SIGTERM, 5 s, SIGKILL) should have ended it long before
    with lock:
        figures = job_figures(list(events))
    figures.update(outcome=outcome.kind if outcome else "did not end", message=outcome.message[:800] if outcome else "",
                   stopped=stopped_because, seconds=round(time.monotonic() - started, 1))
    if outcome is None or outcome.kind == "failed":
        figures["log_tail"] = log_tail(log_path)
    return figures


def job_figures(events: list[Any]) -> dict[str, Any]:
    from tunestudio.events import Failed, Log, Progress

    progress = [e for e in events if isinstance(e, Progress) and e.loss is not None]
    logs = [e.message for e in events if isinstance(e, Log)]
    losses = [e.loss for e in progress]
    figures: dict[str, Any] = {
        "steps": len(progress),
        "first_loss": _mean(losses[:3]), "last_loss": _mean(losses[-3:]),
        "tokens_per_s": progress[-1].tokens_per_second if progress else None,
        "steady_tokens_per_s": steady_rate(progress),
        "peak_memory_mb": max((e.peak_memory_mb or 0 for e in progress), default=None),
        "model": next((m for m in logs if m.startswith("model: ")), ""),
        "decision": next((m for m in logs if m.startswith("precision auto")), ""),
    }
    failed = next((e for e in events if isinstance(e, Failed)), None)
    if failed is not None:  # where it failed: the traceback's last lines
        figures["failed_at"] = [line[:300] for line in failed.traceback.strip().splitlines()[-3:]]
    return figures


def steady_rate(progress: list[Any]) -> float | None:
    """Tokens per second over the logged steps after the first third (the first steps pay for warm-up)."""
    timed = [e for e in progress if e.num_tokens is not None and e.elapsed_seconds is not None]
    if len(timed) < 3:
        return None
    first, last = timed[len(timed) // 3], timed[-1]
    span = last.elapsed_seconds - first.elapsed_seconds
    return (last.num_tokens - first.num_tokens) / span if span > 0 else None


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def log_tail(path: Path, lines: int = 8) -> list[str]:
    """The job log's last lines, progress bars left out."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    kept = [line for line in text.splitlines() if line.strip() and not re.search(r"(it|examples)/s\]", line)]
    return [line[:300] for line in kept[-lines:]]


# --- the checks -----------------------------------------------------------------------------------------------
def check_hardware(bench: Bench) -> dict[str, Any]:
    """e. The hardware view lists the GPU by name (nvidia-smi, else NVML)."""
    from tunestudio.api.hardware import hardware

    gpus = hardware()["gpus"]
    named = [g for g in gpus if g.get("name")]
    return {"ok": bool(named) if bench.cuda else True, "gpus": gpus}


def check_qlora(bench: Bench) -> dict[str, Any]:
    """a. QLoRA with 4-bit nf4 weights: the job completes, the loss falls, the layers are 4-bit."""
    steps = bench.plan.qlora_steps
    job = run_job(bench, "qlora", {"training_type": "qlora", "max_steps": steps})
    bench.jobs["qlora"] = job
    four_bit = re.search(r"(\d+) 4-bit layers", job["model"])
    job["four_bit_layers"] = int(four_bit.group(1)) if four_bit else 0
    job["loss_falls"] = job["first_loss"] is not None and job["last_loss"] < job["first_loss"]
    job["ok"] = (job["outcome"] == "completed" and job["steps"] == steps and job["loss_falls"]
                 and job["four_bit_layers"] > 0 and bool(job["tokens_per_s"]))
    return job


def check_precision(bench: Bench, watch: Callable[[int], None] | None = None) -> dict[str, Any]:
    """b. fp32, bf16 and auto LoRA jobs, long enough to be calibrated, stopped after a steady stretch."""
    result: dict[str, Any] = {}
    for precision in ("fp32", "bf16", "auto"):
        try:
            job = run_job(bench, f"lora-{precision}", {"precision": precision, "max_steps": 20_000},
                          stop_after=bench.plan.steady_steps, watch=watch if precision == "bf16" else None)
        except Exception as exc:
            job = {"error": f"{type(exc).__name__}: {exc}"}
        bench.jobs[f"lora-{precision}"] = result[precision] = job
    rates = {p: (result[p].get("steady_tokens_per_s") or 0) for p in result}
    faster = max(rates["fp32"], rates["bf16"])
    result["auto_over_faster_fixed"] = round(rates["auto"] / faster, 3) if faster else None
    result["calibrated"] = "measured" in result["auto"].get("decision", "")
    result["ok"] = (all(result[p].get("outcome") == "cancelled" and rates[p] > 0 for p in rates)
                    and result["calibrated"] and rates["auto"] >= 0.95 * faster)
    return result


class MemoryWatch:
    """The worker's GPU memory as nvidia-smi reports it, and its resident set size, sampled during a job."""

    def __init__(self) -> None:
        self.gpu_used_mb: float | None = None
        self.rss_peak_mb: float | None = None
        self._last = 0.0

    def __call__(self, pid: int) -> None:
        if time.monotonic() - self._last < 1.0:
            return
        self._last = time.monotonic()
        rss = _vm_hwm_mb(pid)
        if rss is not None:
            self.rss_peak_mb = max(self.rss_peak_mb or 0, rss)
        used = _nvidia_smi_used_mb(pid)
        if used is not None:
            self.gpu_used_mb = max(self.gpu_used_mb or 0, used)


def _vm_hwm_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return None


def _nvidia_smi_used_mb(pid: int) -> float | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=5, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid) and parts[1].replace(".", "").isdigit():
            return float(parts[1])
    return None  # not listed (a container may show other pids)


def check_memory(bench: Bench, watch: MemoryWatch) -> dict[str, Any]:
    """c. The peak in Progress events is the allocator's (CUDA) and plausible for this model."""
    assert bench.model_dir is not None
    weights = weights_mb(bench.model_dir)
    peaks = {name: job.get("peak_memory_mb") for name, job in bench.jobs.items()}
    bf16 = peaks.get("lora-bf16")
    result: dict[str, Any] = {"weights_mb": round(weights, 1), "peak_memory_mb": peaks,
                              "bf16_worker_gpu_used_mb": watch.gpu_used_mb,
                              "bf16_worker_rss_peak_mb": watch.rss_peak_mb}
    if not bf16:
        result["ok"] = False
        result["why"] = "no peak from the bf16 job"
        return result
    checks = {"above_weights": bf16 >= 0.9 * weights}
    if bench.cuda:
        import torch

        total = torch.cuda.get_device_properties(0).total_memory / 2**20
        checks["below_gpu"] = bf16 < total
        if watch.gpu_used_mb is not None:  # the process holds the allocator's reserve and its context on top
            checks["below_process_gpu_use"] = bf16 <= watch.gpu_used_mb * 1.01
        if watch.rss_peak_mb is not None:  # equal to the resident set size would mean the CPU fallback
            checks["not_rss"] = abs(bf16 - watch.rss_peak_mb) > 0.02 * watch.rss_peak_mb
        if peaks.get("qlora") and peaks.get("lora-fp32"):
            result["qlora_over_lora_fp32"] = round(peaks["qlora"] / peaks["lora-fp32"], 3)
    result["checks"] = checks
    result["ok"] = all(checks.values())
    return result


def check_oom(bench: Bench) -> dict[str, Any]:
    """d. A job that cannot fit fails fast, classified, with the advice.

    What overflows is the activations a full fine-tune keeps for its backward pass (TRL computes the loss in
    vocabulary chunks, so the logits never exist whole): a floor of 4 hidden-size and 2 intermediate-size
    values per token and layer (measured on this shape, CPU: about 3x that in bf16), sized to twice the memory.
    """
    model_dir = bench.model_dir
    shape = bench.plan.oom_model or bench.plan.model
    if bench.plan.oom_model is not None:
        model_dir = build_model(bench.work, bench.plan.oom_model, "llama-oom")
    assert model_dir is not None
    on_start: Callable[[int], None] | None = None
    if bench.cuda:
        import torch

        free, memory = torch.cuda.mem_get_info()
        expected = "out of GPU memory: "
    else:
        # The worker's address space: what it maps to import and load (~2.2 GB measured) and a little more, so
        # it fails after allocating at most ~2 GB for real
        free = memory = 4 * 2**30
        expected = "out of memory: "

        def on_start(pid: int) -> None:
            resource.prlimit(pid, resource.RLIMIT_AS, (memory, resource.prlimit(pid, resource.RLIMIT_AS)[1]))

    seq = bench.plan.oom_seq
    per_token = shape.layers * (4 * shape.hidden + 2 * shape.intermediate) * (2 if bench.cuda else 4)
    rows = math.ceil(2 * memory / (per_token * seq))
    data = long_rows(model_dir, seq, rows, bench.work / "oom.jsonl")
    fields: dict[str, Any] = {"training_type": "full", "local_datasets": [str(data)], "batch_size": rows,
                              "max_seq_length": seq, "max_steps": 1, "precision": "bf16" if bench.cuda else "fp32"}
    from tunestudio.config import JobConfig

    if "padding_free" in JobConfig.model_fields:
        # one flattened row of every token: attention without flash attention, a different failure (or none)
        fields["padding_free"] = False
    saved, bench.model_dir = bench.model_dir, model_dir
    try:
        job = run_job(bench, "oom", fields, on_start=on_start)
    finally:
        bench.model_dir = saved
    job.update(rows=rows, seq=seq, memory_mb=round(memory / 2**20), memory_free_mb=round(free / 2**20),
               activations_floor_gb=round(rows * seq * per_token / 2**30, 1))
    message = job["message"]
    job["missing_advice"] = [a for a in ADVICE if a not in message]
    job["ok"] = job["outcome"] == "failed" and message.startswith(expected) and not job["missing_advice"]
    return job


# --- the run --------------------------------------------------------------------------------------------------
CHECKS = ("hardware", "qlora", "precision", "memory", "oom")


def run_checks(bench: Bench, wanted: list[str]) -> dict[str, Any]:
    unknown = sorted(set(wanted) - set(CHECKS))
    if unknown:
        raise SystemExit(f"unknown checks: {', '.join(unknown)} (there are {', '.join(CHECKS)})")
    results: dict[str, Any] = {}
    watch = MemoryWatch()

    def model() -> dict[str, Any]:
        bench.model_dir = build_model(bench.work, bench.plan.model, "llama-real-shape")
        return {"ok": True, "weights_mb": round(weights_mb(bench.model_dir), 1)}

    every: dict[str, Callable[[], dict[str, Any]]] = {
        "hardware": lambda: check_hardware(bench),
        "model": model,
        "qlora": lambda: check_qlora(bench),
        "precision": lambda: check_precision(bench, watch),
        "memory": lambda: check_memory(bench, watch),
        "oom": lambda: check_oom(bench),
    }
    needs_model = set(wanted) - {"hardware"}
    for name, check in every.items():
        if name not in wanted and not (name == "model" and needs_model):
            continue
        started = time.monotonic()
        if name not in ("hardware", "model") and bench.model_dir is None:
            result: dict[str, Any] = {"ok": False, "error": "no model (its build failed)"}
        elif bench.left() < 20:
            result = {"ok": False, "error": "skipped: the run's time is spent"}
        else:
            try:
                result = check()
            except Exception as exc:
                result = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                          "where": traceback.format_exc().strip().splitlines()[-3:]}
        result["check_seconds"] = round(time.monotonic() - started, 1)
        results[name] = result
        print(f"[{name}] {'ok' if result.get('ok') else 'NOT OK'}: {json.dumps(result, default=str)[:3000]}",
              flush=True)
    return results


def no_cuda_line() -> str:
    import torch

    build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
    try:
        from tunestudio.api.hardware import hardware

        names = [g["name"] for g in hardware()["gpus"] if g.get("name")]
    except Exception:
        names = []
    seen = f"; nvidia-smi lists {', '.join(names)}" if names else ""
    return (f"bench/gpu.py: no CUDA device visible to torch {torch.__version__} ({build}){seen}; nothing measured "
            "(--cpu-smoke runs the same code on this CPU)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny models, a few steps, on this CPU")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (models, job logs)")
    parser.add_argument("--checks", default=",".join(CHECKS),
                        help=f"a comma-separated subset of {','.join(CHECKS)} (the model is built when one needs it)")
    args = parser.parse_args(argv)
    import torch

    cuda = torch.cuda.is_available() and not args.cpu_smoke
    if not cuda and not args.cpu_smoke:
        print(no_cuda_line(), flush=True)
        return 0
    plan = GPU_PLAN if cuda else SMOKE_PLAN
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="bench-gpu-"))
    device = torch.cuda.get_device_name(0) if cuda else "cpu"
    print(f"bench/gpu.py: {device}, torch {torch.__version__}, work folder {work}", flush=True)
    bench = Bench(work=work, cuda=cuda, plan=plan, deadline=started + plan.budget_s)
    try:
        results = run_checks(bench, [c.strip() for c in args.checks.split(",") if c.strip()])
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"bench": "gpu", "device": device, "torch": torch.__version__, "smoke": not cuda,
                      "seconds": round(time.monotonic() - started, 1),
                      "ok": all(r.get("ok") for r in results.values()), "checks": results}, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
