"""The LM head and the loss at large vocabularies: their share of a training step, and chunked cross-entropy.

Models shaped like a ~135M SmolLM (Llama: hidden 576, 12 layers, 9 heads, 3 kv heads, intermediate
1536, tied embeddings) with a vocabulary of 49,152, 128,256 or 262,144, random weights, built here.
Random token ids, batch 4, every position trained on. LoRA (peft, r=16 on every linear layer, base
frozen, the tied head too) and full fine-tuning; fp32 and bf16 autocast (the forward under autocast,
the backward outside it, as the Trainer does).

Two parts, each in alternating rounds (every variant once per round, the order reversed every other
round; the figures are medians of the rounds and the ratios are taken round by round):

  head  hidden states of the real shape [batch × (seq − 1), 576] → lm_head → cross-entropy, forward
        and backward, alone. Variants:
          full     F.linear + F.cross_entropy on fp32 logits: the model's own loss, every logit materialised
          trl      TRL 1.16's fused head as SFTTrainer runs it (trl.kernels.ChunkedLogProbFunction, 32,768-
                   column tiles recomputed in the backward, with the entropy and top-1 outputs its metrics
                   use): what tunestudio's SFT runs today. On CPU it takes its torch fallback (no Triton).
          trl_lp   the same with the log-probabilities only (not by default: --variants ...,trl_lp)
          chunked  chunked_lm_loss below: tokens in chunks of --chunk, the head fused in, the gradients made
                   in the forward (one pass, no recompute), never more than chunk × vocab logits
          tunestudio  worker/train/lmhead.py's CpuLogProb, what tunestudio's worker runs in place of `trl` on a
                   CPU (the same outputs, chunks of 2^25 logits, gradients made in the forward)
          torch    torch 2.13's F.linear_cross_entropy with LinearCrossEntropyOptions(batch_chunk_size=chunk)
                   (not by default either)
        Reported: time of one forward+backward, the peak RSS rise during it (VmHWM after a reset, heap
        trimmed first), and the loss and gradient errors against fp32 `full`.
  step  one forward+backward of the whole model (no optimizer step) with: full (model(input_ids,
        labels=...)), trl (model(..., fused_lm_head=True) after trl's add_fused_lm_head), chunked (the
        backbone, then chunked_lm_loss), and trivial (the backbone and a near-free head: the body's time).
        Head + loss share of the step = (full − trivial) / full.

Every timed call also records the share of the machine that other processes took meanwhile
(/proc/stat); --max-others with --retries repeats a disturbed call and keeps the least disturbed try.

    .venv/bin/python bench/realistic.py [--vocabs 49152,262144] [--seqs 128] [--modes lora]
        [--precisions fp32,bf16] [--parts head,step] [--rounds 2] [--steps 1] [--chunk 256]
        [--variants full,trl,tunestudio,chunked] [--max-others 0.25 --retries 0] [--threads 1]

The default (LoRA, two vocabularies, seq 128, one torch thread) took 6 minutes on 2 cores with
another job holding one of them; full fine-tuning (--modes full), seq 512, the 128,256 vocabulary
and --threads 2 (a quiet machine) are flags.

Issue 18: adopt a chunked/fused cross-entropy if it wins without changing the loss (fp32 relative loss
difference ≤ 1e-5). Prints the load average (the machine is shared). Ends with one JSON line.
`chunked_lm_loss` imports without running anything (tests/bench/test_realistic.py checks it).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tunestudio.worker.train.lmhead, from a checkout

HIDDEN, BATCH, IGNORE = 576, 4, -100
LOSS_TOLERANCE = 1e-5  # relative, fp32: "without changing the loss"
HEAD_VARIANTS = ("full", "trl", "trl_lp", "tunestudio", "chunked", "torch")
STEP_VARIANTS = ("full", "trl", "chunked", "trivial")


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy of hidden @ weight.T, chunk by chunk of tokens, gradients made in the forward.

    Each chunk's logits are computed once (in `dtype`), reduced in fp32 (fp64 for fp64) to the loss, then turned in
    place into softmax − one-hot, the chunk's gradient: the backward only scales the saved gradients.
    """

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk: int,
                dtype: torch.dtype, want_grads: bool) -> torch.Tensor:
        need_h = want_grads and ctx.needs_input_grad[0]
        need_w = want_grads and ctx.needs_input_grad[1]
        acc = torch.float64 if dtype == torch.float64 else torch.float32  # softmax and sums
        w = weight.to(dtype)
        total = torch.zeros((), dtype=acc, device=hidden.device)
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        for start in range(0, hidden.shape[0], chunk):
            h = hidden[start:start + chunk].to(dtype)
            y = labels[start:start + chunk]
            valid = y != IGNORE
            index = y.clamp(min=0).unsqueeze(1)
            logits = (h @ w.t()).to(acc)  # the chunk's only [chunk, vocab] buffer in fp32 (no copy there)
            top = logits.amax(dim=1, keepdim=True)
            target = logits.gather(1, index).squeeze(1) - top.squeeze(1)
            sums = logits.sub_(top).exp_().sum(dim=1, keepdim=True)  # in place: exp(logits - max)
            total += ((sums.squeeze(1).log() - target) * valid).sum()
            if need_h or need_w:
                grad = logits.div_(sums)  # softmax, in place
                grad.scatter_add_(1, index, -valid.unsqueeze(1).to(grad.dtype))  # − one-hot
                if not bool(valid.all()):
                    grad.mul_(valid.unsqueeze(1))  # ignored tokens: no gradient
                grad = grad.to(dtype)
                if need_h:
                    grad_h[start:start + chunk] = grad @ w
                if need_w:
                    grad_w += grad.t() @ h
        ctx.save_for_backward(grad_h, grad_w)
        ctx.weight_dtype = weight.dtype
        return total

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        grad_h, grad_w = ctx.saved_tensors
        return (None if grad_h is None else grad_h * grad_out,
                None if grad_w is None else (grad_w * grad_out).to(ctx.weight_dtype), None, None, None, None)


def chunked_lm_loss(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk: int = 1024,
                    num_items: int | torch.Tensor | None = None) -> torch.Tensor:
    """Mean cross-entropy of `hidden @ weight.T` against `labels`, holding at most `chunk` × vocab logits.

    hidden [N, H], weight [V, H] (the lm_head's), labels [N] already shifted, -100 ignored. Divides by
    `num_items` when given (the Trainer's count), else by the number of labelled tokens, as
    transformers' ForCausalLMLoss does. Under autocast the matmuls run in the autocast dtype, as
    F.linear would; the softmax and the sums in fp32.
    """
    device = hidden.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
    with torch.autocast(device, enabled=False):
        total = _ChunkedLinearCrossEntropy.apply(hidden, weight, labels, chunk, dtype, torch.is_grad_enabled())
    count = (labels != IGNORE).sum() if num_items is None else torch.as_tensor(num_items)
    return total / count.clamp(min=1)


def reference_lm_loss(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The standard path: every logit materialised, upcast to fp32, cross-entropy (mean over labelled tokens)."""
    return F.cross_entropy(F.linear(hidden, weight).float(), labels, ignore_index=IGNORE)


def trl_lm_loss(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                outputs: tuple[str, ...] = ("log_probs", "entropy", "is_top1")) -> torch.Tensor:
    """TRL 1.16's fused head with the outputs SFTTrainer asks for, reduced as its fused forward does."""
    from trl.kernels import ChunkedLogProbFunction
    from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE

    mask = labels != IGNORE
    log_probs, *_ = ChunkedLogProbFunction.apply(hidden[mask], weight, None, labels[mask], 1.0,
                                                 _CHUNKED_LOGPROB_CHUNK_SIZE, None, 1.0, outputs)
    return -log_probs.sum() / mask.sum().clamp(min=1)


def tunestudio_lm_loss(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """worker/train/lmhead.py's CpuLogProb with SFTTrainer's outputs, reduced as TRL's fused forward does."""
    from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE

    from tunestudio.worker.train.lmhead import CpuLogProb

    mask = labels != IGNORE
    log_probs, *_ = CpuLogProb.apply(torch.is_grad_enabled(), hidden[mask], weight, None, labels[mask], 1.0,
                                     _CHUNKED_LOGPROB_CHUNK_SIZE, None, 1.0, ("log_probs", "entropy", "is_top1"))
    return -log_probs.sum() / mask.sum().clamp(min=1)


def torch_lm_loss(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk: int) -> torch.Tensor:
    """torch's own chunked linear_cross_entropy. It is a custom op that autocast does not cast, so cast here."""
    device = hidden.device.type
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
        hidden, weight = hidden.to(dtype), weight.to(dtype)
    options = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=chunk, chunking_method=None)
    return F.linear_cross_entropy(hidden, weight, labels, ignore_index=IGNORE, options=options)


# --- measuring -------------------------------------------------------------------------------------

_LIBC = ctypes.CDLL("libc.so.6")


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def _reset_peak() -> int:
    """Trim the heap, reset the peak RSS (VmHWM), return the RSS now (kB)."""
    _LIBC.malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_kb("VmRSS")


_TICK = os.sysconf("SC_CLK_TCK")
CORES = os.cpu_count() or 1


def _machine_busy_s() -> float:
    """Busy CPU seconds of the whole machine since boot (/proc/stat)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:9]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields)
    return (user + nice + system + irq + softirq + steal) / _TICK


def measure(fn: Any) -> tuple[float, float, float]:
    """(seconds, peak RSS rise in MB, share of the machine others took) of one call."""
    base = _reset_peak()
    own0, busy0 = sum(os.times()[:2]), _machine_busy_s()
    start = time.perf_counter()
    fn()
    seconds = time.perf_counter() - start
    others = (_machine_busy_s() - busy0) - (sum(os.times()[:2]) - own0)
    return seconds, (_status_kb("VmHWM") - base) / 1024, max(0.0, others / (CORES * seconds))


def autocast(bf16: bool) -> Any:
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)


def rounds_of(variants: tuple[str, ...], call: Any, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Every variant `steps` times per round, alternating (callers warm up first).

    A call during which other processes took more than --max-others of the machine is tried again,
    up to --retries times; the least disturbed try counts. Per variant: per-round median seconds,
    the largest peak RSS rise, the others' shares of the calls that counted.
    """
    out: dict[str, dict[str, Any]] = {v: {"rounds": [], "mb": 0.0, "others": []} for v in variants}
    for r in range(args.rounds):
        for variant in variants if r % 2 == 0 else tuple(reversed(variants)):
            times = []
            for _ in range(args.steps):
                tries = [measure(lambda v=variant: call(v))]
                while tries[-1][2] > args.max_others and len(tries) <= args.retries:
                    tries.append(measure(lambda v=variant: call(v)))
                seconds, mb, others = min(tries, key=lambda t: t[2])
                times.append(seconds)
                out[variant]["mb"] = max(out[variant]["mb"], mb)
                out[variant]["others"].append(round(others, 3))
            out[variant]["rounds"].append(statistics.median(times))
    for stats in out.values():
        stats["s"] = statistics.median(stats["rounds"])
    return out


def ratio(stats: dict[str, dict[str, Any]], a: str, b: str) -> float:
    """Median over rounds of time(a) / time(b) within the same round."""
    return statistics.median(x / y for x, y in zip(stats[a]["rounds"], stats[b]["rounds"], strict=True))


def _rel(a: torch.Tensor | float, b: torch.Tensor | float) -> float:
    if isinstance(a, torch.Tensor):
        return float((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-30))
    return abs(a - b) / max(abs(b), 1e-30)


# --- part 1: the head alone ------------------------------------------------------------------------

def head_part(vocab: int, seq: int, mode: str, precision: str, args: argparse.Namespace) -> dict[str, Any]:
    n = BATCH * (seq - 1)
    torch.manual_seed(0)
    hidden0 = torch.randn(n, HIDDEN)
    weight0 = torch.randn(vocab, HIDDEN) * 0.02
    labels = torch.randint(0, vocab, (n,))
    wgrad, bf16 = mode == "full", precision == "bf16"

    def fn(variant: str, bf16: bool = bf16) -> Any:
        hidden = hidden0.clone().requires_grad_(True)
        weight = weight0.clone().requires_grad_(wgrad) if wgrad else weight0
        with autocast(bf16):
            if variant == "full":
                loss = reference_lm_loss(hidden, weight, labels)
            elif variant == "trl":
                loss = trl_lm_loss(hidden, weight, labels)
            elif variant == "trl_lp":
                loss = trl_lm_loss(hidden, weight, labels, ("log_probs",))
            elif variant == "tunestudio":
                loss = tunestudio_lm_loss(hidden, weight, labels)
            elif variant == "chunked":
                loss = chunked_lm_loss(hidden, weight, labels, args.chunk)
            else:
                loss = torch_lm_loss(hidden, weight, labels, args.chunk)
        loss.backward()
        return loss.item(), hidden.grad, weight.grad if wgrad else None

    variants = tuple(v for v in HEAD_VARIANTS if v in args.variants)
    ref = fn("full", False)  # the fp32 standard path: the reference for every variant and precision
    errors = {}
    for variant in variants:
        loss, gh, gw = fn(variant)
        errors[variant] = {"loss": _rel(loss, ref[0]), "grad_hidden": _rel(gh, ref[1]),
                           "grad_weight": _rel(gw, ref[2]) if wgrad else None}
    stats = rounds_of(variants, fn, args)  # the error calls above were the warm-up
    return {"part": "head", "vocab": vocab, "seq": seq, "tokens": n, "mode": mode, "precision": precision,
            "logits_mb": n * vocab * 4 / 2**20, "loss": ref[0],
            "s": {v: stats[v]["s"] for v in variants}, "rounds": {v: stats[v]["rounds"] for v in variants},
            "peak_mb": {v: stats[v]["mb"] for v in variants}, "others": {v: stats[v]["others"] for v in variants},
            "ratio_to_full": {v: ratio(stats, v, "full") for v in variants if "full" in variants},
            "errors": errors}


# --- part 2: the whole step ------------------------------------------------------------------------

def build_model(vocab: int, mode: str) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    config = LlamaConfig(vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=1536, num_hidden_layers=12,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                         tie_word_embeddings=True, use_cache=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))  # as SFTTrainer does, before PEFT
    if mode == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear",
                                                 task_type="CAUSAL_LM"))
    model.train()
    return model


def step_part(model: torch.nn.Module, vocab: int, seq: int, mode: str, precision: str,
              args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(1)
    ids = torch.randint(0, vocab, (BATCH, seq))
    base = model.get_base_model() if mode == "lora" else model
    probe = torch.randn(HIDDEN) / HIDDEN
    bf16 = precision == "bf16"

    def fn(variant: str) -> float:
        with autocast(bf16):
            if variant == "full":
                loss = model(input_ids=ids, labels=ids).loss
            elif variant == "trl":
                loss = model(input_ids=ids, labels=ids, fused_lm_head=True).loss
            else:
                hidden = base.model(input_ids=ids).last_hidden_state
                if variant == "chunked":
                    loss = chunked_lm_loss(hidden[:, :-1].reshape(-1, HIDDEN), base.lm_head.weight,
                                           ids[:, 1:].reshape(-1), args.chunk)
                else:
                    loss = (hidden.float() * probe).mean()
        loss.backward()
        model.zero_grad(set_to_none=True)
        return loss.item()

    variants = tuple(v for v in STEP_VARIANTS if v in args.variants or v == "trivial")
    losses = {v: fn(v) for v in variants}  # also the warm-up
    losses.pop("trivial", None)
    stats = rounds_of(variants, fn, args)
    shares = [(f - t) / f for f, t in zip(stats["full"]["rounds"], stats["trivial"]["rounds"], strict=True)] \
        if "full" in variants else []
    return {"part": "step", "vocab": vocab, "seq": seq, "tokens": BATCH * seq, "mode": mode, "precision": precision,
            "s": {v: stats[v]["s"] for v in variants}, "rounds": {v: stats[v]["rounds"] for v in variants},
            "peak_mb": {v: stats[v]["mb"] for v in variants}, "others": {v: stats[v]["others"] for v in variants},
            "ratio_to_full": {v: ratio(stats, v, "full") for v in variants if "full" in variants},
            "head_share": statistics.median(shares) if shares else None,
            "loss": losses, "loss_rel_to_full": {v: _rel(x, losses["full"]) for v, x in losses.items()}
            if "full" in losses else {}}


# --- main ------------------------------------------------------------------------------------------

def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _words(text: str) -> list[str]:
    return [x for x in text.split(",") if x]


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _others(row: dict[str, Any]) -> str:
    shares = [x for xs in row["others"].values() for x in xs]
    return f"others took {statistics.median(shares):.0%} (max {max(shares):.0%}) of the machine"


def print_head(row: dict[str, Any]) -> None:
    cells = []
    for v, s in row["s"].items():
        e = row["errors"][v]
        gw = f"/{e['grad_weight']:.0e}" if e["grad_weight"] is not None else ""
        cells.append(f"{v} {s * 1000:7.0f} ms {row['peak_mb'][v]:6.0f} MB x{row['ratio_to_full'].get(v, 0):.2f} "
                     f"(loss {e['loss']:.0e}, grad {e['grad_hidden']:.0e}{gw})")
    print(f"head V={row['vocab']:>6} seq {row['seq']} {row['mode']:>4} {row['precision']}: " + " | ".join(cells)
          + f" | {_others(row)}", flush=True)


def print_step(row: dict[str, Any]) -> None:
    cells = [f"{v} {s:6.2f} s {row['peak_mb'][v]:6.0f} MB x{row['ratio_to_full'].get(v, 0):.2f}"
             for v, s in row["s"].items()]
    share = f"head+loss share {row['head_share']:.0%}" if row["head_share"] is not None else ""
    losses = ", ".join(f"{v} {d:.0e}" for v, d in row["loss_rel_to_full"].items() if v != "full")
    print(f"step V={row['vocab']:>6} seq {row['seq']} {row['mode']:>4} {row['precision']}: " + " | ".join(cells)
          + f" | {share} | loss vs full: {losses} | {_others(row)}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vocabs", default="49152,262144", help="comma-separated (e.g. 49152,128256,262144)")
    parser.add_argument("--seqs", default="128", help="comma-separated sequence lengths (batch is 4)")
    parser.add_argument("--modes", default="lora")
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--parts", default="head,step")
    parser.add_argument("--variants", default="full,trl,tunestudio,chunked",
                        help="of full,trl,trl_lp,tunestudio,chunked,torch; trivial always runs in the step part")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=1, help="timed calls per variant per round")
    parser.add_argument("--chunk", type=int, default=256, help="tokens per chunk (chunked and torch)")
    parser.add_argument("--max-others", type=float, default=0.25,
                        help="retry a call during which other processes took more than this share of the machine")
    parser.add_argument("--retries", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (0: torch's default). 1 by default: on a loaded 2-core machine, 2 threads "
                             "wait on each other whenever another process holds a core (steps 2-7x slower, erratic)")
    args = parser.parse_args()
    args.variants = _words(args.variants)
    parts = _words(args.parts)
    if args.threads:
        torch.set_num_threads(args.threads)
    started, load0 = time.monotonic(), _load()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average {load0}", flush=True)
    rows: list[dict[str, Any]] = []
    for vocab in _ints(args.vocabs):
        for mode in _words(args.modes):
            model = build_model(vocab, mode) if "step" in parts else None
            for seq in _ints(args.seqs):
                for precision in _words(args.precisions):
                    if "head" in parts:
                        rows.append(head_part(vocab, seq, mode, precision, args))
                        print_head(rows[-1])
                    if model is not None:
                        rows.append(step_part(model, vocab, seq, mode, precision, args))
                        print_step(rows[-1])
            del model
    load1 = _load()
    heads = [r for r in rows if r["part"] == "head"]
    fp32_ok = all(r["errors"][v]["loss"] <= LOSS_TOLERANCE for r in heads if r["precision"] == "fp32"
                  for v in ("chunked", "torch") if v in r["errors"])
    faster = [r["ratio_to_full"]["chunked"] < 1 for r in rows if "chunked" in r.get("ratio_to_full", {})]
    print(f"chunked faster than full in {sum(faster)} of {len(faster)} rows; fp32 loss within "
          f"{LOSS_TOLERANCE:g}: {fp32_ok}; load average {load0} -> {load1}; "
          f"{time.monotonic() - started:.0f} s", flush=True)
    for r in rows:
        r["rounds"] = {v: [round(x, 4) for x in xs] for v, xs in r["rounds"].items()}
    print(json.dumps({"bench": "realistic", "load_avg_start": load0, "load_avg_end": load1,
                      "chunk": args.chunk, "rounds": args.rounds, "steps": args.steps,
                      "seconds": round(time.monotonic() - started), "fp32_loss_unchanged": fp32_ok,
                      "chunked_faster_rows": sum(faster), "rows_compared": len(faster), "rows": rows},
                     default=str))


if __name__ == "__main__":
    main()
