"""What a job will need, from arithmetic on the model's config.json alone (no torch: the parent may call it).

Parameters and trainable parameters follow the Llama-style layout most causal
LMs share (embeddings, per-layer attention with grouped KV heads, a gated MLP,
an untied or tied head). Memory is the weights, gradients and AdamW state of
what trains, and the activations of one micro-batch: the per-layer tensors
kept for backward (about 16 hidden-sized values per token and layer plus the
MLP's 3 intermediate-sized ones, and the attention scores) and the logits of
the head and loss, which dominate for large vocabularies unless the loss is
computed in tiles (TRL's fused head for SFT: `fused_head`). It is an estimate to
decide on, not a measurement: the worker reports the real peak in its progress
events.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Estimate", "estimate", "model_shape"]

_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class Shape:
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    tied: bool


@dataclass(frozen=True)
class Estimate:
    parameters: int
    trainable_parameters: int
    weights_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    activations_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.gradients_bytes + self.optimizer_bytes + self.activations_bytes

    def as_dict(self) -> dict[str, int]:
        return {**asdict(self), "total_bytes": self.total_bytes}


def model_shape(config: dict[str, Any]) -> Shape:
    """The shape of a model from its config.json (a multimodal one's text_config when it has one)."""
    text = config.get("text_config") or config
    hidden = int(text["hidden_size"])
    heads = int(text.get("num_attention_heads") or max(1, hidden // 64))
    return Shape(
        vocab=int(text.get("vocab_size") or 32_000),
        hidden=hidden,
        layers=int(text.get("num_hidden_layers") or text.get("n_layer") or 1),
        heads=heads,
        kv_heads=int(text.get("num_key_value_heads") or heads),
        intermediate=int(text.get("intermediate_size") or 4 * hidden),
        tied=bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", False))),
    )


def _layer_linears(s: Shape) -> dict[str, tuple[int, int]]:
    head_dim = s.hidden // s.heads
    kv = s.kv_heads * head_dim
    return {"q_proj": (s.hidden, s.hidden), "k_proj": (s.hidden, kv), "v_proj": (s.hidden, kv),
            "o_proj": (s.hidden, s.hidden), "gate_proj": (s.hidden, s.intermediate),
            "up_proj": (s.hidden, s.intermediate), "down_proj": (s.intermediate, s.hidden)}


def estimate(
    config: dict[str, Any],
    training_type: str = "lora",
    lora_r: int = 16,
    target_modules: list[str] | None = None,
    batch_size: int = 2,
    seq_len: int = 512,
    precision: str = "fp32",
    gradient_checkpointing: bool = False,
    fused_head: bool = False,
) -> Estimate:
    """The memory a job needs (see the module's note). precision: the weights' and activations' dtype.

    fused_head: the loss is computed through TRL's fused LM head (SFTTrainer, TRL 1.16): tiles of at most
    4096 tokens x 32768 vocabulary entries and a few floats per token, never the full logits.
    """
    s = model_shape(config)
    linears = _layer_linears(s)
    per_layer = sum(i * o for i, o in linears.values()) + 2 * s.hidden  # two norms
    embeddings = s.vocab * s.hidden
    params = s.layers * per_layer + embeddings + (0 if s.tied else embeddings) + s.hidden
    if training_type == "full":
        trainable = params
    else:
        wanted = set(target_modules or linears)
        trainable = s.layers * sum(lora_r * (i + o) for name, (i, o) in linears.items() if name in wanted)
    width = _BYTES.get(precision, 4)
    weight_width = 0.5 if training_type == "qlora" else 4  # bf16 autocast keeps fp32 master weights
    tokens = batch_size * seq_len
    kept = 16 * s.hidden + 3 * s.intermediate + 2 * s.heads * seq_len  # per token and layer
    layer_acts = tokens * s.layers * (2 * s.hidden if gradient_checkpointing else kept) * width
    if fused_head:
        logits = min(tokens, 4096) * min(s.vocab, 32768) * 4 * 2 + tokens * 16  # a tile forward and backward
    else:
        logits = tokens * s.vocab * (width + 4 + 4)  # the logits, their fp32 copy for the loss, its gradient
    return Estimate(
        parameters=params,
        trainable_parameters=trainable,
        weights_bytes=int(params * weight_width),
        gradients_bytes=trainable * 4,
        optimizer_bytes=trainable * 8,  # AdamW: two fp32 moments
        activations_bytes=int(layer_acts + logits),
    )
