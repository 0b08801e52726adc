"""The vision side of an image job's estimate (tunestudio/estimate.py): a vision-language model's vision tower and
projector from config.json's `vision_config`, the tokens each image puts in the sequence, and what the tower holds
in memory. Arithmetic only (the parent calls it): no torch.

Two families are built and tested here (tests/test_estimate_vision.py holds their counts to torch's and to their
processors'), the rest are counted as a plain SigLIP/CLIP tower and said to be approximate:
- Idefics3 / SmolVLM: a SigLIP tower that takes square views of `image_size` px. Without image_splitting an image is
  one view; with it, an image is resized to the job's longest side (max_image_size), cut into tiles of `image_size`
  and given a global view beside them. A view is (image_size / patch_size)^2 patches; the connector's pixel
  shuffle folds scale_factor^2 of them into one token (SmolVLM-256M: 1,024 patches, 64 tokens a 512 px view), and
  each view's tokens come wrapped in a few marker tokens.
- Qwen2-VL: the image keeps its shape, resized to at most max_pixels in multiples of patch_size x
  spatial_merge_size (the worker sets max_pixels to the job's longest side squared, at most the processor's own cap);
  (h / patch_size) x (w / patch_size) patches, spatial_merge_size^2 to a token, between vision_start and vision_end.
The figures are the largest an image can give (a square one at the job's size): memory is planned for the worst row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["ImageSize", "VisionTower", "pixel_cap"]

IDEFICS3 = {"idefics3", "smolvlm"}
QWEN2_VL = {"qwen2_vl"}
DEFAULT_SIDE = 448  # worker/modalities/image.side(): a tower that names no input size
# Values a patch keeps per tower layer for the backward, in the compute precision, as (per hidden, per intermediate)
# value: fitted to the peak memory a tower's forward and backward take (bench/vision_activations.py, sdpa, fp32,
# MLP 4x wide). Trained whole, a SigLIP layer keeps its input, the norms' outputs, q, k, v, the attention's output
# and the MLP's input and activation (~24 h); Qwen2-VL's keeps the rotary copies of q and k and its attention's
# per-image splits as well (~42 h). LoRA (peft, dropout 0.05) keeps each adapted layer's dropped-out input beside
# them, and its forward's temporaries raise the peak further: ~56 h for both families.
KEPT_FULL = {"idefics3": (12, 3), "qwen2_vl": (30, 3), "other": (12, 3)}
KEPT_LORA = (44, 3)


@dataclass(frozen=True)
class ImageSize:
    """What one image of the job becomes: its views, the patches the tower sees, the tokens in the sequence."""

    side: int  # the longest side it is resized to (a tile's side for Idefics3 without splitting)
    views: int  # tower inputs (tiles and the global view)
    patches: int  # all its views' patches
    tokens: int  # its tokens in the sequence, the family's markers included

    def as_dict(self) -> dict[str, int]:
        return {"side": self.side, "views": self.views, "patches": self.patches, "tokens": self.tokens}


@dataclass(frozen=True)
class VisionTower:
    family: str  # "idefics3", "qwen2_vl" or "other" (counted as a SigLIP tower: approximate)
    hidden: int
    layers: int
    intermediate: int
    heads: int
    patch: int
    image_size: int | None  # the tower's own view size (None: Qwen2-VL takes any size)
    merge: int  # patches folded into a token, per side: Idefics3's scale_factor, Qwen2-VL's spatial_merge_size
    text_hidden: int
    patch_values: int  # the values a patch embeds: channels x patch^2 (x 2 frames for Qwen2-VL)
    tokens_per_image: int | None = None  # a fixed count the config states (Gemma 3's mm_tokens_per_image)

    @classmethod
    def of(cls, config: dict[str, Any], text_hidden: int) -> VisionTower | None:
        """The tower of a config.json with a `vision_config`; None without one."""
        vision = config.get("vision_config")
        if not isinstance(vision, dict):
            return None
        family = str(config.get("model_type") or "")

        def get(name: str, default: int) -> int:
            value = vision.get(name)
            return value if isinstance(value, int) and value > 0 else default

        if family in QWEN2_VL:
            embed, patch = get("embed_dim", 1280), get("patch_size", 14)
            return cls("qwen2_vl", embed, get("depth", 32), embed * get("mlp_ratio", 4), get("num_heads", 16), patch,
                       None, get("spatial_merge_size", 2), get("hidden_size", text_hidden),
                       get("in_chans", get("in_channels", 3)) * get("temporal_patch_size", 2) * patch * patch)
        size = vision.get("image_size")
        size = size[0] if isinstance(size, list) and size else size
        patch = get("patch_size", 14)
        fixed = config.get("mm_tokens_per_image")
        return cls("idefics3" if family in IDEFICS3 else "other", get("hidden_size", 768),
                   get("num_hidden_layers", 12), get("intermediate_size", 3072), get("num_attention_heads", 12),
                   patch, size if isinstance(size, int) and size > 0 else DEFAULT_SIDE,
                   int(config.get("scale_factor") or 2) if family in IDEFICS3 else 1, text_hidden,
                   get("num_channels", 3) * patch * patch, fixed if isinstance(fixed, int) and fixed > 0 else None)

    @property
    def approximate(self) -> bool:
        return self.family == "other"

    def linears(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear layer of one tower block, by its module name (all with a bias)."""
        h, i = self.hidden, self.intermediate
        if self.family == "qwen2_vl":
            return {"attn.qkv": (h, 3 * h), "attn.proj": (h, h), "mlp.fc1": (h, i), "mlp.fc2": (i, h)}
        return {"self_attn.q_proj": (h, h), "self_attn.k_proj": (h, h), "self_attn.v_proj": (h, h),
                "self_attn.out_proj": (h, h), "mlp.fc1": (h, i), "mlp.fc2": (i, h)}

    def projector(self) -> dict[str, tuple[int, int, bool]]:
        """(in, out, bias) of the linear layers that bring the tower's patches to the language model's width."""
        folded = self.hidden * self.merge * self.merge
        if self.family == "qwen2_vl":
            return {"merger.mlp.0": (folded, folded, True), "merger.mlp.2": (folded, self.text_hidden, True)}
        if self.family == "idefics3":
            return {"connector.modality_projection.proj": (folded, self.text_hidden, False)}
        return {"multi_modal_projector": (self.hidden, self.text_hidden, True)}

    def parameters(self) -> tuple[int, int]:
        """(all the tower's and the projector's parameters, those in their linear layers' weights)."""
        h = self.hidden
        block = sum(a * b + b for a, b in self.linears().values()) + 4 * h  # two LayerNorms
        projector = sum(a * b + (b if bias else 0) for a, b, bias in self.projector().values())
        linear = self.layers * sum(a * b for a, b in self.linears().values()) + sum(
            a * b for a, b, _ in self.projector().values())
        if self.family == "qwen2_vl":  # a patch embedding without bias, rotary positions, the merger's LayerNorm
            rest = self.patch_values * h + 2 * h
        else:  # a patch embedding with bias, learned positions, the post-LayerNorm
            rest = self.patch_values * h + h + (self.image_size or DEFAULT_SIDE) ** 2 // self.patch**2 * h + 2 * h
        return self.layers * block + projector + rest, linear

    def image(self, max_image_size: int | None, splitting: bool, max_pixels: int | None = None) -> ImageSize:
        """The largest image of the job as the processor makes it. max_pixels: the processor's own cap (Qwen2-VL's
        size.longest_edge, its processor_config.json), when known."""
        if self.family == "qwen2_vl":
            return self._qwen2_vl(max_image_size or DEFAULT_SIDE, max_pixels)
        tile = self.image_size or DEFAULT_SIDE
        per_view = (tile // self.patch) ** 2
        tokens = per_view // (self.merge * self.merge)
        if self.family != "idefics3":
            return ImageSize(tile, 1, per_view, self.tokens_per_image or tokens)
        side = max_image_size or tile
        across = math.ceil(side / tile) if splitting and side > tile else 0
        tiles = across * across
        # a tile: <fake_token_around_image><row_r_col_c> and its tokens, a newline after each row of tiles; the
        # global view: a newline, <fake_token_around_image><global-img>, its tokens, <fake_token_around_image>. The
        # last row's newline and the global view's are one token, "\n\n", in SmolVLM's vocabulary (and the tiny one's)
        markers = 3 + (2 * tiles + across if tiles else 0)
        return ImageSize(side if tiles else tile, tiles + 1, (tiles + 1) * per_view, (tiles + 1) * tokens + markers)

    def _qwen2_vl(self, side: int, max_pixels: int | None) -> ImageSize:
        pixels = min(side * side, max_pixels) if max_pixels else side * side
        step = self.patch * self.merge
        edge = max(step, math.floor(math.sqrt(pixels) / step) * step)  # a square image, in multiples of the step
        patches = (edge // self.patch) ** 2
        return ImageSize(edge, 1, patches, patches // (self.merge * self.merge) + 2)  # <|vision_start|>, _end|>

    def lora_names(self, target_modules: list[str] | None, attention: bool, mlp: bool) -> set[str]:
        """The tower's and projector's linears LoRA wraps when the vision layers train: `target_modules` when given
        (a name or the end of one), else by the switches, the projector counted as MLP
        (worker/modalities/image.targets)."""
        names = set(self.linears()) | set(self.projector())
        chosen = [t for t in (target_modules or []) if t != "all-linear"]
        if chosen:
            return {n for n in names if any(n == t or n.endswith("." + t) for t in chosen)}
        return {n for n in names if (attention if n.startswith(("self_attn.", "attn.")) else mlp)}

    def lora_parameters(self, names: set[str], r: int) -> int:
        blocks = self.layers * sum(r * (a + b) for n, (a, b) in self.linears().items() if n in names)
        return blocks + sum(r * (a + b) for n, (a, b, _) in self.projector().items() if n in names)

    def activations(self, image: ImageSize, images: int, width: int, checkpointing: bool, attention: str,
                    full: bool = False) -> int:
        """Bytes the tower keeps for the backward of `images` images (all views) when it trains: every weight
        (full) or adapters (LoRA, QLoRA)."""
        patches = images * image.patches
        per_hidden, per_intermediate = KEPT_FULL[self.family] if full else KEPT_LORA
        kept = per_hidden * self.hidden + per_intermediate * self.intermediate
        if attention == "eager":  # the attention probabilities, per head and key, within a view
            kept += int(1.5 * self.heads * image.patches / image.views)
        if checkpointing:  # each layer's input kept, one layer's tensors live while it is recomputed
            return patches * (self.layers * self.hidden + kept) * width
        return patches * self.layers * kept * width

    def flops(self, image: ImageSize) -> float:
        """A forward pass of one image through the tower and projector: 2 FLOPs a weight a patch meets, and the
        attention's scores and sums within each view."""
        per_patch = self.layers * sum(a * b for a, b in self.linears().values())
        projected = sum(a * b for a, b, _ in self.projector().values()) / (self.merge * self.merge)
        attention = 4 * self.layers * self.hidden * image.patches / image.views
        return 2.0 * image.patches * (per_patch + projected) + image.patches * attention


def pixel_cap(processor: dict[str, Any] | None) -> int | None:
    """Qwen2-VL's family's pixel cap (its size.longest_edge, or max_pixels, counts pixels, not a side: the family's
    image processors have a merge_size) from a processor_config.json's `image_processor` or a
    preprocessor_config.json; None for other processors or when it states none."""
    if not isinstance(processor, dict):
        return None
    inner = processor.get("image_processor")
    found = inner if isinstance(inner, dict) else processor
    if not isinstance(found.get("merge_size"), int) and not isinstance(found.get("max_pixels"), int):
        return None
    size = found.get("size") if isinstance(found.get("size"), dict) else {}
    for value in (found.get("max_pixels"), size.get("max_pixels"), size.get("longest_edge")):
        if isinstance(value, int) and value > 0:
            return value
    return None
