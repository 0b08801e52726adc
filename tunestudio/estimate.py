"""What a job will need, from arithmetic on the model's config.json alone (no torch: the parent calls it too).

One memory model for the whole project: the worker's `gradient_checkpointing:
auto` (worker/train/memory.py) and the page's estimate before Start (api/estimate.py)
both read it, so the page says what the worker will decide.

Parameters and trainable parameters follow the layout most causal LMs share
(embeddings, per-layer attention with grouped KV heads, a gated MLP or a
two-matrix one, an untied or tied head); `tests/test_estimate.py` holds them to
what torch and peft count. Memory is what the worker holds:
- weights as loaded: fp32 (worker/train/model.py loads every model in fp32; bf16 and
  fp16 are autocast over fp32 master weights), QLoRA's block linears in nf4
  (half a byte a weight and its scales);
- what trains: LoRA adapters in fp32, the gradients in fp32, the optimizer
  state (AdamW: two fp32 moments);
- the activations of one micro-batch (preference methods run the chosen and the
  rejected answer together: `MethodSpec.rows_per_example` rows): per token and layer about 24
  hidden-sized values and 5 intermediate-sized ones, in the compute precision
  (fitted to the memory a Llama's forward and backward take with sdpa attention,
  `bench/activations.py`), and with eager attention its scores, about 1.5 per
  head and key; with activation checkpointing only each layer's input and one
  layer live;
- the logits of the head and loss, which dominate for large vocabularies unless
  the loss is computed in tiles (TRL's fused head, SFTTrainer: `MethodSpec.fused_head`).
It is an estimate to decide on, not a measurement: the worker reports the real
peak in its progress events.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from tunestudio.config import METHOD_SPECS

__all__ = ["HEADROOM", "EstimateUnavailable", "Memory", "Shape", "checkpointing_needed", "flops_per_token",
           "job_memory", "memory"]

GIB = 1024**3
HEADROOM = 0.9  # the share of free memory a job may plan to fill
RUNTIME_BYTES = GIB // 2  # the worker process's own libraries, or a CUDA context
_ACTIVATION_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# Model types whose MLP has two matrices (up, down) rather than three (gate, up, down); their head is tied.
_TWO_MATRIX_MLP = {"gpt2", "gpt_neox", "gptj", "opt", "bloom", "falcon", "phi", "starcoder2", "gpt_bigcode"}
# Optimizer state, bytes per trainable parameter (AdamW and the rest: two fp32 moments).
_OPTIMIZER_BYTES = {"adamw_8bit": 2.0, "paged_adamw_8bit": 2.0, "sgd": 0.0, "adafactor": 0.5}
_ATTENTION = {"q_proj", "k_proj", "v_proj", "o_proj"}


class EstimateUnavailable(ValueError):
    """The config lacks what the arithmetic needs."""


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    vocab: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool
    mlp_matrices: int

    @classmethod
    def of(cls, config: dict[str, Any]) -> Shape:
        """The shape from a config.json (a multimodal one keeps its language model's numbers in text_config)."""
        inner = config.get("text_config")
        config = {**config, **inner} if isinstance(inner, dict) else config

        def first(*names: str) -> Any:
            return next((config[n] for n in names if isinstance(config.get(n), int) and config[n] > 0), None)

        hidden = first("hidden_size", "n_embd", "d_model")
        layers = first("num_hidden_layers", "n_layer", "num_layers")
        vocab = first("vocab_size")
        heads = first("num_attention_heads", "n_head")
        if not (hidden and layers and vocab and heads):
            raise EstimateUnavailable("config.json lacks hidden_size, num_hidden_layers, vocab_size or "
                                      "num_attention_heads")
        two = config.get("model_type") in _TWO_MATRIX_MLP
        return cls(
            hidden=hidden, layers=layers, vocab=vocab, heads=heads,
            intermediate=first("intermediate_size", "n_inner", "ffn_dim") or 4 * hidden,
            kv_heads=first("num_key_value_heads") or heads,
            head_dim=first("head_dim") or hidden // heads,
            tied=bool(config.get("tie_word_embeddings", two)),
            mlp_matrices=2 if two else 3,
        )

    def linears(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear layer of one block, by the module name LoRA targets."""
        h, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        out = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
               "up_proj": (h, i), "down_proj": (i, h)}
        if self.mlp_matrices == 3:
            out["gate_proj"] = (h, i)
        return out

    def parameters(self) -> tuple[int, int]:
        """(all parameters, those in the blocks' linear layers)."""
        linear = self.layers * sum(a * b for a, b in self.linears().values())
        norms = self.layers * 2 * self.hidden + self.hidden
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return linear + norms + embeddings, linear

    def compute_parameters(self) -> int:
        """The weights a token is multiplied by: the blocks' linears and the head (the embedding is a lookup)."""
        return self.parameters()[1] + self.vocab * self.hidden

    def lora_targets(self, target_modules: Iterable[str] | None = None, attention: bool = True,
                     mlp: bool = True) -> set[str]:
        """The block linears LoRA wraps: `target_modules` when given (names or suffixes), else every linear
        ("all-linear"), less the attention or the MLP ones when those are not fine-tuned."""
        names = set(self.linears())
        chosen = [t for t in (target_modules or []) if t != "all-linear"]
        if chosen:
            return {n for n in names if any(n == t or n.endswith(t) or t.endswith(n) for t in chosen)}
        if not attention:
            names -= _ATTENTION
        if not mlp:
            names &= _ATTENTION
        return names


@dataclass(frozen=True)
class Memory:
    parameters: int
    trainable: int
    weights_bytes: int
    adapter_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    activations_bytes: int  # the layers' kept tensors and the head's logits, one micro-batch
    logits_bytes: int  # the head's share of activations_bytes

    @property
    def beyond_weights(self) -> int:
        """What training adds to the loaded weights."""
        return self.adapter_bytes + self.gradients_bytes + self.optimizer_bytes + self.activations_bytes

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.beyond_weights

    def as_dict(self) -> dict[str, int]:
        return {**asdict(self), "total_bytes": self.total_bytes}


def memory(
    config: dict[str, Any],
    *,
    training_type: str = "lora",
    method: str = "sft",
    lora_r: int = 16,
    target_modules: Iterable[str] | None = None,
    finetune_attention_modules: bool = True,
    finetune_mlp_modules: bool = True,
    batch_size: int = 2,
    seq_len: int = 512,
    precision: str = "fp32",
    optim: str = "adamw_torch_fused",
    checkpointing: bool = False,
    parameters: int | None = None,
    attention: str = "sdpa",
) -> Memory:
    """The memory a job needs (see the module's note). precision: the compute precision (fp32, bf16, fp16);
    parameters: an exact count (the safetensors headers) to use instead of the arithmetic's; attention: the
    model's attention implementation (transformers' default is sdpa, which keeps no per-key scores)."""
    shape = Shape.of(config)
    counted, linear = shape.parameters()
    params = parameters or counted
    # fp32 as loaded; QLoRA's block linears in nf4 with their scales (the rest stays fp32)
    weights = int(linear * 0.5 * 1.07 + (params - linear) * 4) if training_type == "qlora" else params * 4
    if training_type == "full":
        trainable, adapter = params, 0
    else:
        targets = shape.lora_targets(target_modules, finetune_attention_modules, finetune_mlp_modules)
        trainable = shape.layers * sum(lora_r * (a + b) for name, (a, b) in shape.linears().items()
                                       if name in targets)
        adapter = trainable * 4
    width = _ACTIVATION_BYTES.get(precision, 4)
    spec = METHOD_SPECS[method]  # its rows per example (a pair's two answers) and whether its loss is fused
    tokens = batch_size * spec.rows_per_example * seq_len
    kept = 24 * shape.hidden + 5 * shape.intermediate  # values per token and layer (bench/activations.py)
    if attention == "eager":  # the attention probabilities, per head and key
        kept += int(1.5 * shape.heads * seq_len)
    if checkpointing:  # each layer's input kept, one layer's tensors live while it is recomputed
        layers = tokens * (shape.layers * 2 * shape.hidden + kept) * width
    else:
        layers = tokens * shape.layers * kept * width
    if spec.fused_head:
        # a tile of at most 4096 tokens x 32768 vocabulary entries, forward and backward, a few floats per token
        logits = min(tokens, 4096) * min(shape.vocab, 32768) * 4 * 2 + tokens * 16
    else:
        logits = tokens * shape.vocab * (width + 4 + 4)  # the logits, their fp32 copy for the loss, its gradient
    return Memory(
        parameters=params, trainable=trainable, weights_bytes=weights, adapter_bytes=adapter,
        gradients_bytes=trainable * 4, optimizer_bytes=int(trainable * _OPTIMIZER_BYTES.get(optim, 8.0)),
        activations_bytes=int(layers + logits), logits_bytes=int(logits),
    )


def job_memory(config: dict[str, Any], job: Mapping[str, Any], *, precision: str, checkpointing: bool,
               parameters: int | None = None) -> Memory:
    """`memory()` for a job given by JobConfig's field names (the worker's config dumped, or the page's form),
    so the worker and the page read a job alike. config: the model's config.json; its `_attn_implementation`,
    when a loaded model's config carries it, names the attention (else transformers' default, sdpa)."""
    return memory(config, training_type=str(job["training_type"]), method=str(job.get("method", "sft")),
                  lora_r=int(job["lora_r"]), target_modules=job.get("target_modules"),
                  finetune_attention_modules=bool(job.get("finetune_attention_modules", True)),
                  finetune_mlp_modules=bool(job.get("finetune_mlp_modules", True)),
                  batch_size=int(job["batch_size"]), seq_len=int(job["max_seq_length"]), precision=precision,
                  optim=str(job["optim"]), checkpointing=checkpointing, parameters=parameters,
                  attention=str(config.get("_attn_implementation") or "sdpa"))


def checkpointing_needed(without: Memory, free: int) -> bool:
    """`gradient_checkpointing: auto`'s rule: on only when what training adds to the loaded weights would not
    fit in HEADROOM of the memory free once they are loaded."""
    return without.beyond_weights > HEADROOM * free


def flops_per_token(config: dict[str, Any], training_type: str) -> float:
    """Training FLOPs per token: the forward is 2 per weight a token meets (Shape.compute_parameters); the
    backward about twice that when every weight trains (full), about once with a frozen base (LoRA, QLoRA: the
    input gradients, the adapters' own being small)."""
    return (6.0 if training_type == "full" else 4.0) * Shape.of(config).compute_parameters()
