"""The vision tower's part of tunestudio/estimate.py's memory model (estimate_vision.py) against what a tower's
forward and backward really take, as bench/activations.py does for the language model.

For each shape, a fresh process builds a vision tower (Idefics3/SmolVLM's SigLIP tower, or Qwen2-VL's), runs one
forward and backward over a batch of images in fp32 (sdpa attention), and reports the rise of its peak RSS; the
estimate is the tower's activations (VisionTower.activations) and its gradients: every weight trained (full), or
LoRA adapters on every linear of the tower (peft, r 16, as an image job's defaults put them). The ratio
measured / estimated is what the estimate misses (> 1: it says too little).

    .venv/bin/python bench/vision_activations.py

Ends with one JSON line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

LAYERS, RANK = 4, 16
# (family, hidden, intermediate, heads, image side, patch, images)
SHAPES = [("idefics3", 256, 1024, 4, 256, 16, 4), ("idefics3", 384, 1536, 6, 512, 16, 2),
          ("idefics3", 768, 3072, 12, 512, 16, 2),  # SmolVLM-256M's tower (4 of its 12 layers), two 512 px images
          ("qwen2_vl", 256, 1024, 4, 448, 14, 2), ("qwen2_vl", 512, 2048, 8, 448, 14, 2)]

CHILD = """
import json, resource, sys, torch
family, hidden, intermediate, heads, side, patch, images, layers, mode, rank = json.loads(sys.argv[1])
torch.manual_seed(0)
if family == "idefics3":
    from transformers import Idefics3VisionConfig
    from transformers.models.idefics3.modeling_idefics3 import Idefics3VisionTransformer
    config = Idefics3VisionConfig(hidden_size=hidden, intermediate_size=intermediate, num_attention_heads=heads,
                                  num_hidden_layers=layers, image_size=side, patch_size=patch)
    config._attn_implementation = "sdpa"
    tower = Idefics3VisionTransformer(config)
    per_side = side // patch
    inputs = {"pixel_values": torch.randn(images, 3, side, side),
              "patch_attention_mask": torch.ones(images, per_side, per_side, dtype=torch.bool)}
    names = ["q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"]
else:
    from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel
    config = Qwen2VLVisionConfig(depth=layers, embed_dim=hidden, mlp_ratio=intermediate // hidden, num_heads=heads,
                                 hidden_size=576, patch_size=patch)
    config._attn_implementation = "sdpa"
    tower = Qwen2VisionTransformerPretrainedModel(config)
    per_side = side // patch
    inputs = {"hidden_states": torch.randn(images * per_side * per_side, 3 * 2 * patch * patch),
              "grid_thw": torch.tensor([[1, per_side, per_side]] * images)}
    names = ["qkv", "proj", "fc1", "fc2"]
if mode == "lora":
    from peft import LoraConfig, get_peft_model
    tower = get_peft_model(tower, LoraConfig(r=rank, target_modules=names, lora_dropout=0.05))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = tower(**inputs)
hidden_states = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
hidden_states.float().pow(2).mean().backward()
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
"""


def estimated(family: str, hidden: int, intermediate: int, heads: int, side: int, patch: int, images: int,
              mode: str) -> int:
    from tunestudio.estimate_vision import VisionTower

    tower = VisionTower(family, hidden, LAYERS, intermediate, heads, patch, side if family == "idefics3" else None,
                        1, hidden, 3 * patch * patch)
    picture = tower.image(side, False, None)
    activations = tower.activations(picture, images, 4, False, "sdpa", mode == "full")
    names = set(tower.linears())
    trained = tower.parameters()[0] if mode == "full" else tower.lora_parameters(names, RANK)
    return activations + 4 * trained


def main() -> None:
    rows = []
    for family, hidden, intermediate, heads, side, patch, images in SHAPES:
        for mode in ("full", "lora"):
            shape = [family, hidden, intermediate, heads, side, patch, images, LAYERS, mode, RANK]
            out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(shape)], capture_output=True, text=True,
                                 timeout=900, check=True)
            measured = int(out.stdout.split()[-1])
            guess = estimated(family, hidden, intermediate, heads, side, patch, images, mode)
            patches = images * (side // patch) ** 2
            rows.append({"family": family, "mode": mode, "hidden": hidden, "intermediate": intermediate,
                         "patches": patches, "measured_mb": round(measured / 2**20, 1),
                         "estimated_mb": round(guess / 2**20, 1), "ratio": round(measured / guess, 3)})
            print(f"{family:8} {mode:4} h {hidden:4} i {intermediate:5} patches {patches:5}: measured "
                  f"{measured / 2**20:7.1f} MB, estimated {guess / 2**20:7.1f} MB, ratio {measured / guess:.2f}",
                  flush=True)
    print(json.dumps({"bench": "vision_activations", "layers": LAYERS, "shapes": rows}))


if __name__ == "__main__":
    main()
