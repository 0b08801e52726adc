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
  the loss is computed in tiles (TRL's fused head, SFTTrainer: `MethodSpec.fused_head`);
- an image job's vision tower and projector (tunestudio/estimate_vision.py): their weights, their adapters (or,
  full, their training) as the vision switches choose, and, when they train, the tower's activations for a
  micro-batch's images at the job's size; the images' tokens are part of max_seq_length (the worker refuses a
  row longer than it), so the language model's figures do not change.
It is an estimate to decide on, not a measurement: the worker reports the real
peak in its progress events.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from tunestudio.config import METHOD_SPECS
from tunestudio.estimate_vision import ImageSize, VisionTower

__all__ = ["HEADROOM", "EstimateUnavailable", "ImageJob", "ImageSize", "Memory", "Shape", "Vision", "VisionTower",
           "checkpointing_needed", "flops_per_token", "image_flops", "image_job", "job_memory", "memory"]

GIB = 1024**3
HEADROOM = 0.9  # the share of free memory a job may plan to fill
RUNTIME_BYTES = GIB // 2  # the worker process's own libraries, or a CUDA context
_ACTIVATION_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# Model types whose MLP has two matrices (up, down) rather than three (gate, up, down); their head is tied.
_TWO_MATRIX_MLP = {"gpt2", "gpt_neox", "gptj", "opt", "bloom", "falcon", "phi", "starcoder2", "gpt_bigcode"}
# Optimizer state, bytes per trainable parameter (AdamW and the rest: two fp32 moments).
_OPTIMIZER_BYTES = {"adamw_8bit": 2.0, "paged_adamw_8bit": 2.0, "sgd": 0.0, "adafactor": 0.5}
_ATTENTION = {"q_proj", "k_proj", "v_proj", "o_proj"}
IMAGES_PER_ROW = 1  # the estimate's rows hold one image each (worker/data/images.py allows up to 8)


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
    biased: frozenset[str] = frozenset()  # the block linears with a bias (Qwen2's q, k, v; attention_bias)

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
            biased=_biased(config),
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
        biases = self.layers * sum(out for name, (_, out) in self.linears().items() if name in self.biased)
        norms = self.layers * 2 * self.hidden + self.hidden
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return linear + biases + norms + embeddings, linear

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


def _biased(config: dict[str, Any]) -> frozenset[str]:
    if config.get("attention_bias") is True:
        attention = {"q_proj", "k_proj", "v_proj", "o_proj"}
    elif str(config.get("model_type") or "").startswith("qwen2"):  # Qwen2, Qwen2-VL, Qwen2.5-VL: q, k and v
        attention = {"q_proj", "k_proj", "v_proj"}
    else:
        attention = set()
    return frozenset(attention | ({"gate_proj", "up_proj", "down_proj"} if config.get("mlp_bias") is True else set()))


@dataclass(frozen=True)
class Vision:
    """An image job's vision side in Memory: the tower and projector, and what one image becomes."""

    family: str
    approximate: bool  # a family counted as a plain SigLIP tower (neither Idefics3/SmolVLM nor Qwen2-VL)
    parameters: int
    trainable: int
    trains: bool  # whether the tower's activations are kept for a backward
    activations_bytes: int  # the tower's share of Memory.activations_bytes
    image: ImageSize
    images_per_row: int

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "image": self.image.as_dict()}


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
    vision: Vision | None = None  # an image job's: its share of each figure above

    @property
    def beyond_weights(self) -> int:
        """What training adds to the loaded weights."""
        return self.adapter_bytes + self.gradients_bytes + self.optimizer_bytes + self.activations_bytes

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.beyond_weights

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "vision": self.vision.as_dict() if self.vision else None,
                "total_bytes": self.total_bytes}


@dataclass(frozen=True)
class ImageJob:
    """What an image job adds to memory()'s arguments: the seed's vision switches and the image settings."""

    vision_layers: bool = True  # finetune_vision_layers
    language_layers: bool = True  # finetune_language_layers
    max_image_size: int | None = None
    splitting: bool = False  # image_splitting
    max_pixels: int | None = None  # the processor's own pixel cap (Qwen2-VL), when known
    images_per_row: int = IMAGES_PER_ROW


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
    image: ImageJob | None = None,
) -> Memory:
    """The memory a job needs (see the module's note). precision: the compute precision (fp32, bf16, fp16);
    parameters: an exact count (the safetensors headers) to use instead of the arithmetic's; attention: the
    model's attention implementation (transformers' default is sdpa, which keeps no per-key scores); image: an
    image job's settings (its model's vision tower counted when config.json has a vision_config)."""
    shape = Shape.of(config)
    counted, linear = shape.parameters()
    tower = VisionTower.of(config, shape.hidden) if image is not None else None
    tower_counted, tower_linear = tower.parameters() if tower else (0, 0)
    params = parameters or counted + tower_counted
    linear += tower_linear
    # fp32 as loaded; QLoRA's linears in nf4 with their scales (the rest stays fp32)
    weights = int(linear * 0.5 * 1.07 + (params - linear) * 4) if training_type == "qlora" else params * 4
    targets = list(target_modules or [])
    language, vision = _trained(shape, tower, image, training_type, lora_r, targets,
                                (finetune_attention_modules, finetune_mlp_modules), (params, tower_counted))
    trainable = language + vision
    adapter = 0 if training_type == "full" else trainable * 4
    width = _ACTIVATION_BYTES.get(precision, 4)
    spec = METHOD_SPECS[method]  # its rows per example (a pair's two answers) and whether its loss is fused
    rows = batch_size * spec.rows_per_example
    layers, logits = _text_activations(shape, spec.fused_head, rows * seq_len, seq_len, width, checkpointing,
                                       attention)
    seen = None
    if tower is not None and image is not None:
        picture = tower.image(image.max_image_size, image.splitting, image.max_pixels)
        images = rows * image.images_per_row
        if vision:
            kept = tower.activations(picture, images, width, checkpointing, attention, training_type == "full")
        else:  # a tower that does not train keeps nothing for a backward: only its output, for the language model
            kept = images * picture.patches * tower.hidden * width
        layers += kept
        seen = Vision(family=tower.family, approximate=tower.approximate, parameters=tower_counted, trainable=vision,
                      trains=bool(vision), activations_bytes=kept, image=picture, images_per_row=image.images_per_row)
    return Memory(
        parameters=params, trainable=trainable, weights_bytes=weights, adapter_bytes=adapter,
        gradients_bytes=trainable * 4, optimizer_bytes=int(trainable * _OPTIMIZER_BYTES.get(optim, 8.0)),
        activations_bytes=int(layers + logits), logits_bytes=int(logits), vision=seen,
    )


def _trained(shape: Shape, tower: VisionTower | None, image: ImageJob | None, training_type: str, lora_r: int,
             targets: list[str], switches: tuple[bool, bool], counts: tuple[int, int]) -> tuple[int, int]:
    """(trainable parameters of the language model, of the vision tower and projector). An image job's switches
    choose the sides (worker/modalities/image.py); target_modules, when given, are matched on both sides as peft
    matches them, whatever the switches say (worker/train/model.lora_target_modules)."""
    params, tower_params = counts
    if training_type == "full":  # every weight, less the side an image job's switches freeze
        if image is None:
            return params, 0
        return (params - tower_params if image.language_layers else 0), (tower_params if image.vision_layers else 0)
    attention, mlp = switches
    language = image is None or image.language_layers or bool(targets)
    names = shape.lora_targets(targets, attention, mlp) if language else set()
    text = shape.layers * sum(lora_r * (a + b) for name, (a, b) in shape.linears().items() if name in names)
    vision = 0
    if tower is not None and image is not None and (image.vision_layers or targets):
        vision = tower.lora_parameters(tower.lora_names(targets, attention, mlp), lora_r)
    return text, vision


def _text_activations(shape: Shape, fused_head: bool, tokens: int, seq_len: int, width: int, checkpointing: bool,
                      attention: str) -> tuple[int, int]:
    """(the language model's layers' kept tensors, the head's logits) for a micro-batch of `tokens`."""
    kept = 24 * shape.hidden + 5 * shape.intermediate  # values per token and layer (bench/activations.py)
    if attention == "eager":  # the attention probabilities, per head and key
        kept += int(1.5 * shape.heads * seq_len)
    if checkpointing:  # each layer's input kept, one layer's tensors live while it is recomputed
        layers = tokens * (shape.layers * 2 * shape.hidden + kept) * width
    else:
        layers = tokens * shape.layers * kept * width
    if fused_head:
        # a tile of at most 4096 tokens x 32768 vocabulary entries, forward and backward, a few floats per token
        logits = min(tokens, 4096) * min(shape.vocab, 32768) * 4 * 2 + tokens * 16
    else:
        logits = tokens * shape.vocab * (width + 4 + 4)  # the logits, their fp32 copy for the loss, its gradient
    return layers, logits


def image_job(job: Mapping[str, Any], config: Mapping[str, Any]) -> ImageJob | None:
    """An image job's settings from JobConfig's field names (None: a text job). config: the model's config.json;
    its `_max_pixels`, when the caller read the processor's (estimate_vision.pixel_cap), caps Qwen2-VL's images."""
    if not job.get("is_dataset_image"):
        return None
    cap = config.get("_max_pixels")
    return ImageJob(vision_layers=bool(job.get("finetune_vision_layers", True)),
                    language_layers=bool(job.get("finetune_language_layers", True)),
                    max_image_size=job.get("max_image_size") or None, splitting=bool(job.get("image_splitting")),
                    max_pixels=cap if isinstance(cap, int) and cap > 0 else None)


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
                  attention=str(config.get("_attn_implementation") or "sdpa"), image=image_job(job, config))


def checkpointing_needed(without: Memory, free: int) -> bool:
    """`gradient_checkpointing: auto`'s rule: on only when what training adds to the loaded weights would not
    fit in HEADROOM of the memory free once they are loaded."""
    return without.beyond_weights > HEADROOM * free


def flops_per_token(config: dict[str, Any], training_type: str) -> float:
    """Training FLOPs per token: the forward is 2 per weight a token meets (Shape.compute_parameters); the
    backward about twice that when every weight trains (full), about once with a frozen base (LoRA, QLoRA: the
    input gradients, the adapters' own being small)."""
    return (6.0 if training_type == "full" else 4.0) * Shape.of(config).compute_parameters()


def image_flops(config: dict[str, Any], job: Mapping[str, Any]) -> float:
    """Training FLOPs of one row's images in the vision tower and projector (0: a text job, or a model without a
    tower): the forward (VisionTower.flops), and when the tower trains a backward as flops_per_token counts it; a
    tower that does not train runs its forward only (no gradient reaches the pixels)."""
    image = image_job(job, config)
    tower = VisionTower.of(config, Shape.of(config).hidden) if image is not None else None
    if tower is None or image is None:
        return 0.0
    trains = image.vision_layers or bool(job.get("target_modules"))
    factor = (3.0 if str(job["training_type"]) == "full" else 2.0) if trains else 1.0
    return factor * image.images_per_row * tower.flops(tower.image(image.max_image_size, image.splitting,
                                                                   image.max_pixels))
