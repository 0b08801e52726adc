"""The memory model of tunestudio/estimate.py against what a Llama's forward and backward really take.

For each shape, a fresh process builds a Llama (4 layers, batch 2, rows padded
by a quarter in the second, as batches are), runs one forward and backward in
fp32 with full logits, and reports the rise of its peak RSS; the estimate is
`memory(..., training_type="full", method="kto")` (full logits, one row per
example): its activations and gradients. The ratio measured / estimated is what
the estimate misses (> 1: it says too little).

    .venv/bin/python bench/activations.py

Ends with one JSON line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# (attention, hidden, intermediate, heads, kv heads, seq)
SHAPES = [("sdpa", 256, 512, 16, 4, 512), ("sdpa", 256, 512, 16, 4, 2048), ("sdpa", 256, 1024, 16, 4, 2048),
          ("sdpa", 512, 512, 16, 4, 2048), ("sdpa", 576, 1536, 9, 3, 1024), ("eager", 256, 512, 16, 4, 512),
          ("eager", 256, 512, 16, 4, 2048)]
LAYERS, BATCH, VOCAB = 4, 2, 256

CHILD = """
import json, resource, sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
config = json.loads(sys.argv[1]); seq = int(sys.argv[2])
torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(**config))
ids = torch.randint(0, config["vocab_size"], (2, seq))
mask = torch.ones_like(ids)
mask[1, : seq // 4] = 0
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
model(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
"""


def main() -> None:
    from tunestudio.estimate import memory

    rows = []
    for attention, hidden, intermediate, heads, kv_heads, seq in SHAPES:
        config = {"model_type": "llama", "vocab_size": VOCAB, "hidden_size": hidden, "intermediate_size": intermediate,
                  "num_hidden_layers": LAYERS, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
                  "max_position_embeddings": 8192, "attn_implementation": attention}
        out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(config), str(seq)], capture_output=True,
                             text=True, timeout=600, check=True)
        measured = int(out.stdout.split()[-1])
        got = memory(config, training_type="full", method="kto", batch_size=BATCH, seq_len=seq,
                     attention=attention)
        estimated = got.activations_bytes + got.gradients_bytes
        rows.append({"attention": attention, "hidden": hidden, "intermediate": intermediate, "heads": heads,
                     "seq": seq, "measured_mb": round(measured / 2**20, 1), "estimated_mb": round(estimated / 2**20, 1),
                     "ratio": round(measured / estimated, 3)})
        print(f"{attention:>5} h {hidden:4} i {intermediate:5} heads {heads:2} seq {seq:5}: measured "
              f"{measured / 2**20:7.1f} MB, estimated {estimated / 2**20:7.1f} MB, ratio {measured / estimated:.2f}",
              flush=True)
    print(json.dumps({"bench": "activations", "layers": LAYERS, "batch": BATCH, "shapes": rows}))


if __name__ == "__main__":
    main()
