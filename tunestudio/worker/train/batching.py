"""Padding-free batches: a batch as one flattened row with position ids, when that costs less.

TRL's collator can flatten a batch into one row whose position ids restart at
each example (`padding_free`); transformers builds a block-diagonal causal mask
from those position ids, so no example sees another and the loss is the same
as the padded batch's (tests/worker/test_batching.py checks it for every model
type in PADDING_FREE_MODEL_TYPES). Padding tokens then cost nothing.

With flash attention the flattened row costs exactly its tokens. With sdpa or
eager attention (a CPU, or a GPU without flash-attn) the mask is dense: the
flattened row pays attention over all its tokens squared, where a padded batch
pays each row's length squared. Measured on a 135M Llama with a 128k
vocabulary, LoRA, forward+backward on 2 CPU cores (2026-12-03): rows of 20-110
tokens 1.6-1.8x faster flattened; rows of 100-512 tokens 1.5-1.8x; rows all of
one length 0.81-0.95x. So `padding_free: auto` decides per batch from the
model's shape, with `Costs.flat_pays`; the loss is the same either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Model types whose attention masks follow packed position ids (transformers' masking_utils), checked by
# tests/worker/test_batching.py against the padded loss. gpt2 is not among them: its loss changes.
PADDING_FREE_MODEL_TYPES = frozenset({
    "llama", "mistral", "ministral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma3_text",
    "phi", "phi3", "olmo", "olmo2", "smollm3", "granite", "cohere", "starcoder2", "stablelm", "gpt_neox", "glm4",
})

# The longest flattened row under a dense mask (sdpa, eager): 8192² mask entries are 64 MiB as booleans.
MAX_DENSE_TOKENS = 8192


@dataclass(frozen=True)
class Costs:
    """A step's work, in FLOPs of the forward pass (backward scales both terms alike)."""

    per_token: float  # every linear layer and the head, per token
    per_pair: float  # attention scores and their weighted sum, per (query, key) pair, over all layers
    varlen: bool  # the attention runs each example apart (flash attention): no cost across examples

    @classmethod
    def of(cls, config: Any) -> Costs:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        hidden, layers = int(text.hidden_size), int(text.num_hidden_layers)
        heads = int(text.num_attention_heads)
        head_dim = int(getattr(text, "head_dim", None) or hidden // heads)
        kv = int(getattr(text, "num_key_value_heads", None) or heads) * head_dim
        inter = int(getattr(text, "intermediate_size", None) or 4 * hidden)
        per_layer = hidden * (heads * head_dim) * 2 + hidden * kv * 2 + 3 * hidden * inter
        per_token = 2.0 * (layers * per_layer + hidden * int(text.vocab_size))
        per_pair = 4.0 * heads * head_dim * layers
        implementation = str(getattr(config, "_attn_implementation", "") or "")
        return cls(per_token, per_pair, "flash" in implementation)

    def padded(self, lengths: list[int]) -> float:
        longest = max(lengths)
        return len(lengths) * longest * (self.per_token + longest * self.per_pair)

    def flat(self, lengths: list[int]) -> float:
        total = sum(lengths)
        return total * (self.per_token + (0 if self.varlen else total * self.per_pair))

    def flat_pays(self, lengths: list[int]) -> bool:
        """Whether flattening these rows costs less than padding them (ties: padded)."""
        if len(lengths) < 2:
            return False
        if self.varlen:
            return sum(lengths) < len(lengths) * max(lengths)
        if sum(lengths) > MAX_DENSE_TOKENS:  # a dense mask over the flattened row holds total² entries
            return False
        return self.flat(lengths) < self.padded(lengths)


class ChoosingCollator:
    """TRL's own collators, padded and padding-free, the cheaper one for each batch.

    always=True flattens every batch of two or more rows (`padding_free: true`).
    Counts what it chose, for the job's log.
    """

    def __init__(self, padded: Any, flat: Any, costs: Costs, always: bool = False) -> None:
        self.padded, self.flat, self.costs, self.always = padded, flat, costs, always
        self.batches = 0
        self.flattened = 0

    def reset(self) -> None:
        """Forget the batches formed so far (calibration's, drawn before training)."""
        self.batches = self.flattened = 0

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        lengths = [len(e["input_ids"]) for e in examples]
        use_flat = len(lengths) > 1 and (self.always or self.costs.flat_pays(lengths))
        self.batches += 1
        self.flattened += use_flat
        return (self.flat if use_flat else self.padded)(examples)


def supported(config: Any) -> bool:
    return str(getattr(config, "model_type", "")) in PADDING_FREE_MODEL_TYPES


def install(trainer: Any, setting: bool | str) -> None:
    """Put the padding-free collator on an SFT trainer built without packing (packing is padding-free already:
    TRL's bfd). setting: the job's `padding_free` (True, False or "auto").

    Raises ValueError when padding-free is asked for a model type whose loss it is not known to keep.
    """
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    current = trainer.data_collator
    if setting is False or trainer.args.packing or not isinstance(current, DataCollatorForLanguageModeling):
        return  # off, packed already, or a vision collator
    if current.padding_free:
        return
    config = trainer.model.config
    if not supported(config):
        if setting is True:
            raise ValueError(
                f"padding_free: not verified for model type {getattr(config, 'model_type', '?')!r} (its attention "
                f"may cross examples); verified: {', '.join(sorted(PADDING_FREE_MODEL_TYPES))}. Use auto or false"
            )
        return
    flat = DataCollatorForLanguageModeling(pad_token_id=current.pad_token_id, padding_free=True,
                                           pad_to_multiple_of=current.pad_to_multiple_of)
    trainer.data_collator = ChoosingCollator(current, flat, Costs.of(config), always=setting is True)


def describe(trainer: Any, setting: bool | str) -> str | None:
    """One line for the job's log on how batches are formed; None where the question does not arise."""
    collator = trainer.data_collator
    if not hasattr(trainer.args, "packing"):
        return None  # not an SFT trainer: its batches are its method's own
    if isinstance(collator, ChoosingCollator):
        if collator.batches:
            return f"padding-free batches: {collator.flattened} of {collator.batches} flattened"
        return "padding-free batches: " + ("on" if collator.always else "auto (each batch flattened when that costs "
                                                                         "less for this model)")
    if getattr(trainer.args, "packing", False):
        return "padding-free batches: on (packed rows)"
    if setting == "auto" and not supported(trainer.model.config):
        return f"padding-free batches: off (model type {getattr(trainer.model.config, 'model_type', '?')!r} " \
               "is not verified)"
    return None
