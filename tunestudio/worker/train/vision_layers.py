"""Which layers of a vision-language model train, by the seed's four switches: the vision side (the tower and the
projector that feeds the language model) or the language side, attention or MLP. LoRA gets these layers as its
targets (model.lora_target_modules); a full fine-tune freezes the side switched off.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from tunestudio.config import JobConfig
from tunestudio.worker.errors import UserError

# A module belongs to the vision side when its path names the tower or the projector that feeds the language model.
VISION_PARTS = re.compile(r"(^|\.)(vision_tower|vision_model|visual|vision|connector|multi_modal_projector|"
                          r"mm_projector|merger|image_newline)(\.|$)")
ATTENTION_PARTS = re.compile(r"(^|\.)(self_attn|attn|attention|cross_attn)(\.|$)")
PROJECTOR_PARTS = re.compile(r"(^|\.)(connector|multi_modal_projector|mm_projector|merger)(\.|$)")


def targets(model: Any, cfg: JobConfig) -> list[str]:
    """The linear layers that get adapters, by the switches: vision or language side, attention or MLP (a
    projector counts as the vision side's MLP); never the output head."""
    import torch

    chosen = []
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or name.endswith("lm_head"):
            continue
        vision = bool(VISION_PARTS.search(name))
        if not (cfg.finetune_vision_layers if vision else cfg.finetune_language_layers):
            continue
        attention = bool(ATTENTION_PARTS.search(name)) and not PROJECTOR_PARTS.search(name)
        if cfg.finetune_attention_modules if attention else cfg.finetune_mlp_modules:
            chosen.append(name)
    if not chosen:
        raise UserError("finetune_vision_layers: these switches choose no layer of this model to train")
    return chosen


def describe_targets(names: Sequence[str]) -> str:
    vision = sum(bool(VISION_PARTS.search(n)) for n in names)
    return f"{vision} in the vision tower and projector, {len(names) - vision} in the language model"


def freeze_unchosen(model: Any, cfg: JobConfig) -> None:
    """A full fine-tune trains what the switches choose: the other side's weights are frozen."""
    for name, parameter in model.named_parameters():
        vision = bool(VISION_PARTS.search(name))
        if not (cfg.finetune_vision_layers if vision else cfg.finetune_language_layers):
            parameter.requires_grad_(False)
