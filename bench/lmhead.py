"""The CPU LM head (tunestudio/worker/train/lmhead.py) against plain full logits, forward and backward.

One SFT step's head as TRL 1.16 asks for it (log-probabilities of the labelled tokens, the entropy and whether each
target is the top-1 token; the loss their mean), on random hidden states, under bf16 autocast unless --fp32:
  ours   CpuLogProb, as the worker installs it for TRL's fused head;
  plain  full logits: hidden @ weight^T, log_softmax, gather, the entropy and argmax from the same logits, autograd
         for the backward (what a model's own forward and loss compute).
Shapes: the tiny model's (1,024 tokens, hidden 64, vocabulary 550) and a real one's (540 tokens, hidden 640,
vocabulary 262,144: bench/mfu.py's model and batch). The worker's allocator setting is applied first, as the worker
does (performance.configure_allocator). Median of --rounds, each shape in a fresh order.

    .venv/bin/python bench/lmhead.py [--rounds 5] [--threads N] [--fp32]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = {"tiny": (1024, 64, 550), "real": (540, 640, 262_144)}


def ours(h0, w, targets, bf16: bool) -> list:  # type: ignore[no-untyped-def]
    import torch

    from tunestudio.worker.train.lmhead import CpuLogProb

    h = h0.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        log_probs, entropy, _, _, top1 = CpuLogProb.apply(True, h, w, None, targets, 1.0, 32768, None, 1.0,
                                                          ("log_probs", "entropy", "is_top1"))
    (-log_probs.mean()).backward()
    return [log_probs.detach(), entropy, top1, h.grad]


def plain(h0, w, targets, bf16: bool) -> list:  # type: ignore[no-untyped-def]
    import torch

    h = h0.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = (h @ w.t()).float()
    log_softmax = logits.log_softmax(-1)
    log_probs = log_softmax.gather(1, targets.unsqueeze(1)).squeeze(1)
    with torch.no_grad():
        entropy = -(log_softmax.exp() * log_softmax).sum(-1)
        top1 = logits.argmax(-1) == targets
    (-log_probs.mean()).backward()
    return [log_probs.detach(), entropy, top1, h.grad]


def main() -> None:
    import torch

    from tunestudio.worker.train.performance import configure_allocator

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's choice)")
    parser.add_argument("--fp32", action="store_true", help="no autocast")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    configure_allocator()
    results = {}
    for name, (n, hidden, vocab) in SHAPES.items():
        g = torch.Generator().manual_seed(0)
        h0, w = torch.randn(n, hidden, generator=g), torch.randn(vocab, hidden, generator=g) * 0.05
        targets = torch.randint(0, vocab, (n,), generator=g)

        times: dict[str, list[float]] = {"ours": [], "plain": []}
        outputs = {}
        for round_ in range(args.rounds + 1):  # the first round warms up
            for key, fn in (("ours", ours), ("plain", plain)) if round_ % 2 else (("plain", plain), ("ours", ours)):
                start = time.perf_counter()
                outputs[key] = fn(h0, w, targets, not args.fp32)
                if round_:
                    times[key].append(time.perf_counter() - start)
        median = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
        gap = {label: float((a.detach().double() - b.detach().double()).abs().max())
               for label, a, b in zip(("log_probs", "entropy", "is_top1", "grad_hidden"), outputs["ours"],
                                      outputs["plain"], strict=True)}
        results[name] = {"tokens": n, "hidden": hidden, "vocab": vocab, "ours_ms": round(median["ours"] * 1e3, 2),
                         "plain_ms": round(median["plain"] * 1e3, 2),
                         "ratio": round(median["ours"] / median["plain"], 3), "max_difference": gap}
        print(f"{name}: {n} tokens x vocabulary {vocab}: ours {median['ours'] * 1e3:.1f} ms, plain full logits "
              f"{median['plain'] * 1e3:.1f} ms (ratio {median['ours'] / median['plain']:.2f}); largest differences "
              + ", ".join(f"{k} {v:.1e}" for k, v in gap.items()), flush=True)
    print(json.dumps({"bench": "lmhead", "threads": torch.get_num_threads(), "bf16": not args.fp32,
                      "rounds": args.rounds, "shapes": results}))


if __name__ == "__main__":
    main()
