"""The weights chat generates with: a plain copy of a loaded model, a LoRA job's adapter merged into it.

peft runs a LoRA model as the base layer plus the adapter's two small products in every targeted linear:
~7 extra modules of Python per layer and per token, the cost that dominated decoding on a CPU (issue 29).
Serving merges instead: `Served` keeps a second module tree of the base model (the loaded model stays as it
is, fp32, for the adapters and for `:base`), and for the job being answered sets each targeted linear's
weight to `W + ΔW` (peft's own `get_delta_weight`), computed from the untouched base weights each time the
adapter changes, so switching between jobs and `:base` never drifts. Modules the adapter does not touch
share the loaded model's tensors when the precision is the same (no second copy in memory).

Precision: on a CPU the copy is fp32 by default (`auto`); `TUNESTUDIO_CHAT_PRECISION=bf16` serves a bf16
copy, and `measure` times a layer's matrix-vector products both ways at load and takes bf16 only when it
wins twice by 15 % (models of `BF16_MIN_PARAMS` and more; below, a token is Python, not arithmetic). On a
GPU the model is already loaded in bf16/fp16: the copy is too.
A bf16 copy's greedy answers may differ from fp32's where two tokens' scores are closer than bf16 resolves
(measured in bench/RESULTS.md, issue 29). On this machine small bf16 matrix-vector products measured ~50x
slower than fp32 (torch 2.13's CPU kernels), so the body stays fp32 and only a large output layer gets a bf16
copy, for greedy answers only, with its best candidates rescored in fp32 (`GreedyHead`).

Served only when exactness is kept: plain LoRA on linear layers (no DoRA, no LoRA bias, no modules saved
whole, no trained token rows); anything else answers through the peft model as before.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

import torch

log = logging.getLogger(__name__)
BF16_MIN_PARAMS = 50_000_000
HEAD_MIN_PARAMS = 20_000_000  # an output layer this large is what a token's time is made of (a 32k+ vocabulary)
BF16_MARGIN = 0.85  # bf16 serves when its matrix-vector products take under 85 % of fp32's
PRECISION_ENV = "TUNESTUDIO_CHAT_PRECISION"
_PEFT_PREFIX = "base_model.model."


def serving_dtype(model: Any, device: str) -> torch.dtype:
    """The dtype to generate in: the loaded one on a GPU; on a CPU fp32 unless TUNESTUDIO_CHAT_PRECISION says."""
    loaded = next(model.parameters()).dtype
    if device != "cpu" or loaded != torch.float32:
        return loaded
    choice = os.environ.get(PRECISION_ENV, "auto").strip().lower()
    if choice in ("fp32", "float32"):
        return torch.float32
    if choice in ("bf16", "bfloat16"):
        return torch.bfloat16
    if choice != "measure" or sum(p.numel() for p in model.parameters()) < BF16_MIN_PARAMS:
        # auto: fp32. A bf16 body lost end to end (bench/RESULTS.md, issue 29: TTFT 1.5x and decode 0.63x of
        # the old fp32 path), and torch 2.13's bf16 matrix-vector products took 40-90x fp32's in 3 of 4
        # processes here, 0.3x in the other: no single measurement at load tells which one a process gets.
        return torch.float32
    (fp32_s, bf16_s), again = _matvec_seconds(model), _matvec_seconds(model)  # bf16 must win both times
    chosen = torch.bfloat16 if max(bf16_s, again[1]) < BF16_MARGIN * min(fp32_s, again[0]) else torch.float32
    log.info("chat precision: %s (a layer's matrix-vector products: fp32 %.2f ms, bf16 %.2f ms)",
             chosen, fp32_s * 1000, bf16_s * 1000)
    return chosen


def _matvec_seconds(model: Any, repeats: int = 5) -> tuple[float, float]:
    """One token's products with the body's linears (up to 8 of them: a layer's), fp32 vs bf16 (best of). The
    output layer is left out: it is one large product, where bf16 does win here, and `GreedyHead` takes it."""
    head = model.get_output_embeddings()
    body = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head][:8]
    if not body:
        return 0.0, float("inf")
    timings = []
    with torch.inference_mode():
        for dtype in (torch.float32, torch.bfloat16):
            weights = [w.detach().to(dtype) for w in body]
            inputs = [torch.randn(1, w.shape[1], dtype=dtype) for w in weights]
            best = float("inf")
            for _ in range(repeats):
                started = time.perf_counter()
                for x, w in zip(inputs, weights, strict=True):
                    torch.nn.functional.linear(x, w)
                best = min(best, time.perf_counter() - started)
            timings.append(best)
    return timings[0], timings[1]


def _lora_layers(peft_model: Any, adapter: str) -> dict[str, Any] | None:
    """The adapter's LoRA layers by their module path in the base model, or None when merging would change its
    answers or cannot express it (DoRA, a LoRA bias, whole modules saved, trained token rows, a non-linear
    layer)."""
    from peft import PeftModel
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.lora import LoraLayer
    from peft.utils import PeftType
    from peft.utils.other import AuxiliaryTrainingWrapper

    if not isinstance(peft_model, PeftModel) or adapter not in peft_model.peft_config:
        return None
    config = peft_model.peft_config[adapter]
    if (config.peft_type != PeftType.LORA or getattr(config, "use_dora", False) or getattr(config, "lora_bias", False)
            or getattr(config, "modules_to_save", None) or getattr(config, "trainable_token_indices", None)):
        return None
    layers: dict[str, Any] = {}
    for name, module in peft_model.named_modules():
        if isinstance(module, LoraLayer) and adapter in module.lora_A:
            if type(module) is not LoraLinear or module.merged or not name.startswith(_PEFT_PREFIX):
                return None
            layers[name[len(_PEFT_PREFIX):]] = module
        elif isinstance(module, AuxiliaryTrainingWrapper):  # a module saved whole, or trained token rows
            return None
    return layers


class GreedyHead(torch.nn.Module):
    """The output layer, with a faster way for greedy decoding: every token's score in bf16 (half the bytes of
    the largest matrix a token reads: 168M of a 270M model's parameters at a 262k vocabulary), then the
    `TOP_K` best rescored exactly in fp32. The argmax is the fp32 head's unless two scores lie within fp32
    rounding of each other (the rescoring sums in another order) or the true best falls outside bf16's top
    `TOP_K` (bf16's error is far below the gaps that ranks at 64 leave). Off by default: log-probabilities
    and sampling read every score, in fp32 as before; `greedy()` turns it on around a greedy answer."""

    TOP_K = 64

    def __init__(self, weight: torch.nn.Parameter) -> None:
        super().__init__()
        self.weight = weight
        self.approximate = weight.detach().to(torch.bfloat16)
        self.fast = False

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if not self.fast:
            return torch.nn.functional.linear(hidden, self.weight)
        scores = torch.nn.functional.linear(hidden.to(torch.bfloat16), self.approximate).float()
        top = scores.topk(min(self.TOP_K, scores.shape[-1]), dim=-1).indices
        exact = (self.weight[top] @ hidden.unsqueeze(-1)).squeeze(-1)  # [..., TOP_K] in fp32
        return scores.scatter_(-1, top, exact)

    @contextlib.contextmanager
    def greedy(self) -> Iterator[None]:
        self.fast = True
        try:
            yield
        finally:
            self.fast = False


def _greedy_head_pays(weight: torch.Tensor, repeats: int = 5) -> tuple[bool, float, float]:
    """Whether the bf16 head is clearly faster than the fp32 one here; (answer, fp32 s, bf16 s)."""
    timings = []
    with torch.inference_mode():
        for w in (weight.detach(), weight.detach().to(torch.bfloat16)):
            x = torch.randn(1, w.shape[1], dtype=w.dtype)
            best = float("inf")
            for _ in range(repeats):
                started = time.perf_counter()
                torch.nn.functional.linear(x, w)
                best = min(best, time.perf_counter() - started)
            timings.append(best)
    return timings[1] < BF16_MARGIN * timings[0], timings[0], timings[1]


class Served:
    """A module tree like the loaded model's, in `dtype`, that generation runs on (see the module's notes)."""

    def __init__(self, model: Any, dtype: torch.dtype) -> None:
        self.dtype = dtype
        # A second module tree whose tensors are the loaded model's (the memo makes deepcopy share them), then
        # each parameter replaced by its copy in `dtype` (tied ones stay tied; the same dtype: shared).
        memo: dict[int, Any] = {id(t): t for t in [*model.parameters(), *model.buffers()]}
        served = copy.deepcopy(model, memo)
        if dtype != next(model.parameters()).dtype:
            converted: dict[int, torch.nn.Parameter] = {}
            for module in served.modules():
                for name, param in list(module._parameters.items()):
                    if param is None:
                        continue
                    if id(param) not in converted:
                        converted[id(param)] = torch.nn.Parameter(param.detach().to(dtype), requires_grad=False)
                    module._parameters[name] = converted[id(param)]
            for module in served.modules():  # rotary frequencies and the like stay fp32, as from_pretrained keeps
                for name, buffer in list(module._buffers.items()):
                    if buffer is not None and buffer.is_floating_point() and name not in ("inv_freq",
                                                                                            "original_inv_freq"):
                        module._buffers[name] = buffer.to(dtype)
            served.config.dtype = dtype
        head = served.get_output_embeddings()
        if (dtype == torch.float32 and type(head) is torch.nn.Linear and head.bias is None
                and str(head.weight.device) == "cpu" and head.weight.numel() >= HEAD_MIN_PARAMS
                and os.environ.get(PRECISION_ENV, "auto").strip().lower() not in ("fp32", "float32")):
            pays, fp32_s, bf16_s = _greedy_head_pays(head.weight)
            log.info("greedy output layer: %s (fp32 %.1f ms, bf16 %.1f ms)", "bf16 + exact top-k" if pays else "fp32",
                     fp32_s * 1000, bf16_s * 1000)
            if pays:
                served.set_output_embeddings(GreedyHead(head.weight))
        served.eval()
        self.model = served
        self._modules = dict(served.named_modules())
        self.adapter: str | None = None  # what the served weights hold now
        self._merged: dict[str, Any] = {}  # module path → the LoRA layer merged there

    def can_merge(self, peft_model: Any, adapter: str) -> bool:
        return _lora_layers(peft_model, adapter) is not None

    def forget(self, adapter: str) -> None:
        """The adapter's weights changed (reloaded): merge it again when it is next asked for."""
        if self.adapter == adapter:
            self.adapter = "\0stale"

    def merge(self, peft_model: Any, adapter: str | None) -> bool:
        """Set the weights to the base's plus `adapter`'s (None: the base's alone); False when they already were."""
        if adapter == self.adapter:
            return False
        layers = {} if adapter is None else _lora_layers(peft_model, adapter)
        if layers is None:
            raise ValueError(f"adapter {adapter} cannot be merged")
        with torch.no_grad():
            for path, layer in self._merged.items():
                if path not in layers:
                    self._set_weight(path, layer.base_layer.weight)
            for path, layer in layers.items():
                base = layer.base_layer.weight
                delta = layer.get_delta_weight(adapter)
                self._set_weight(path, (base.float() + delta.float()).to(base.dtype))
        self._merged = layers
        self.adapter = adapter
        return True

    def _set_weight(self, path: str, weight: torch.Tensor) -> None:
        module = self._modules[path]
        module._parameters["weight"] = torch.nn.Parameter(weight.detach().to(self.dtype), requires_grad=False)
        if isinstance(module, GreedyHead):  # an adapter on the output layer: its bf16 scores follow
            module.approximate = weight.detach().to(torch.bfloat16)
