"""The weights chat generates with: a plain copy of a loaded model, a LoRA job's adapter merged into it.

peft runs a LoRA model as the base layer plus the adapter's two small products in every targeted linear:
~7 extra modules of Python per layer and per token, the cost that dominated decoding on a CPU (issue 29).
Serving merges instead: `Served` keeps a second module tree of the base model (the loaded model stays as it
is, fp32, for the adapters and for `:base`), and for the job being answered sets each targeted linear's
weight to `W + ΔW` (peft's own `get_delta_weight`), computed from the untouched base weights each time the
adapter changes, so switching between jobs and `:base` never drifts. Modules the adapter does not touch
share the loaded model's tensors when the precision is the same (no second copy in memory).

Precision: chat on a CPU answers from an int8 copy of the served weights by default (`auto`, issue 29), beside
the fp32 one: decoding one token reads every weight once, so its time is the weights' bytes (a 256M model: 1 GB
in fp32, 256 MB in int8, what llama.cpp's q8_0 reads). The int8 copy is torch's dynamic quantization (weights per
output channel, activations per token, fbgemm's kernels), made for models of `INT8_MIN_PARAMS` and more when a
layer's int8 products measure faster than fp32's at load; its output layer's best `TOP_K` candidates are
rescored exactly in fp32 (`Int8Head`). Its answers may differ from fp32's where two tokens' scores lie closer
than int8 resolves (measured in bench/RESULTS.md, issue 29). Log-probabilities (`/v1/completions`) always read
the fp32 copy, exactly. The chat worker makes the int8 copy in a thread after the load (`background`), begun once
the worker is quiet (quiet.py: the answer that loaded the model has been sent, and a second has passed; under steady
load `INT8_MAX_DEFER_S` after the load at most): until it is whole, chat answers
from the exact copy, so a model's first request waits for the load and not for the copy, nor shares the cores
with it (issue 40: on a 256M model with a 262k vocabulary, seconds, most of them fbgemm packing the output layer).
`TUNESTUDIO_CHAT_PRECISION=fp32` serves fp32 answers (the path before issue 29), `int8`
forces the int8 copy at any size, `bf16` serves a bf16 copy, and `measure` times a layer's bf16 products and
takes bf16 only when it wins twice by 15 %. On a GPU the model is already loaded in bf16/fp16: the copy is too.
Without the int8 copy, on this machine small bf16 matrix-vector products measured far slower than fp32
(torch 2.13's CPU kernels), so the body stays fp32 and only a large output layer gets a bf16 copy, for greedy
answers only, with its best candidates rescored in fp32 (`GreedyHead`).

Served only when exactness is kept: plain LoRA on linear layers (no DoRA, no LoRA bias, no modules saved
whole, no trained token rows); anything else answers through the peft model as before.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import torch

from tunestudio.worker.serve.quiet import Quiet

log = logging.getLogger(__name__)
BF16_MIN_PARAMS = 50_000_000
INT8_MIN_PARAMS = 50_000_000  # below, a token is Python, not bytes: int8 would change answers for nothing
INT8_MARGIN = 0.85  # the int8 copy serves when a layer's int8 products take under 85 % of fp32's
INT8_ADAPTERS = 2  # adapters whose quantized layers stay made (a job and another, or :base, answered in turn)
# the int8 copy begins once the worker is quiet (quiet.py), or this long after the load under steady load: until it
# is made chat answers at fp32's speed (a third of int8's on the 256M model)
INT8_MAX_DEFER_S = 5.0
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


def _matvec_seconds(model: Any) -> tuple[float, float]:
    """One token's products with the body's linears (up to 8 of them: a layer's), fp32 vs bf16 (best of). The
    output layer is left out: it is one large product, where bf16 does win here, and `GreedyHead` takes it."""
    body = [m.weight.detach() for m in _body_linears(model)]
    if not body:
        return 0.0, float("inf")
    timings = []
    for dtype in (torch.float32, torch.bfloat16):
        weights = [w.to(dtype) for w in body]
        inputs = [torch.randn(1, w.shape[1], dtype=dtype) for w in weights]
        timings.append(_best_seconds([lambda x=x, w=w: torch.nn.functional.linear(x, w)
                                      for x, w in zip(inputs, weights, strict=True)]))
    return timings[0], timings[1]


def _body_linears(model: Any, count: int = 8) -> list[torch.nn.Linear]:
    """Up to `count` of the model's plain linear layers other than its output layer (a layer's worth)."""
    head = model.get_output_embeddings()
    return [m for m in model.modules() if type(m) is torch.nn.Linear and m is not head][:count]


def _best_seconds(calls: list[Any], repeats: int = 5) -> float:
    """The best of `repeats` timings of making every call once, in inference mode."""
    best = float("inf")
    with torch.inference_mode():
        for _ in range(repeats):
            started = time.perf_counter()
            for call in calls:
                call()
            best = min(best, time.perf_counter() - started)
    return best


def int8_chat(model: Any, device: str) -> bool:
    """Whether chat answers from an int8 copy (see the module's notes): on a CPU, for an fp32 model, by default
    when it is large enough and a layer's int8 products measure faster; always with TUNESTUDIO_CHAT_PRECISION=int8."""
    choice = os.environ.get(PRECISION_ENV, "auto").strip().lower()
    if (device != "cpu" or next(model.parameters()).dtype != torch.float32 or choice not in ("auto", "int8")
            or "fbgemm" not in torch.backends.quantized.supported_engines):
        return False
    if choice == "int8":
        return True
    if sum(p.numel() for p in model.parameters()) < INT8_MIN_PARAMS:
        return False
    fp32_s, int8_s = _int8_matvec_seconds(model)
    chosen = int8_s < INT8_MARGIN * fp32_s
    log.info("chat weights: %s (a layer's matrix-vector products: fp32 %.2f ms, int8 %.2f ms)",
             "int8" if chosen else "fp32", fp32_s * 1000, int8_s * 1000)
    return chosen


def _int8_matvec_seconds(model: Any) -> tuple[float, float]:
    """One token's products with up to 8 of the body's linears (a layer's), fp32 vs int8 (best of)."""
    body = _body_linears(model)
    if not body:
        return 0.0, float("inf")
    inputs = [torch.randn(1, m.weight.shape[1]) for m in body]
    fp32_s, int8_s = (_best_seconds([lambda x=x, layer=layer: layer(x)
                                     for x, layer in zip(inputs, layers, strict=True)])
                      for layers in (body, [_quantized(m.weight, m.bias) for m in body]))
    return fp32_s, int8_s


def _quantized(weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.nn.Module:
    """A dynamically quantized linear layer (int8 weights per output channel) with these fp32 weights: what
    `DynamicLinear.from_float` makes of a Linear with the per-channel dynamic qconfig, without its two wasted
    passes over a weight's size (an fp32 Linear's random initialisation, and a placeholder int8 weight of the
    full shape packed and thrown away): on the 262,144 x 640 output layer 3.8 s became about 1.5 s."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear
    from torch.ao.nn.quantized.modules.utils import _quantize_weight
    from torch.ao.quantization import per_channel_dynamic_qconfig

    fp32 = weight.detach().float()
    observer = per_channel_dynamic_qconfig.weight()
    observer(fp32)
    layer = DynamicLinear(1, 1, dtype=torch.qint8)  # its placeholder weight is 1 x 1
    layer.set_weight_bias(_quantize_weight(fp32, observer), None if bias is None else bias.detach().float())
    layer.in_features, layer.out_features = fp32.shape[1], fp32.shape[0]
    return layer


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


class Int8Head(torch.nn.Module):
    """The int8 copy's output layer: every token's score from int8 weights, the `TOP_K` best rescored exactly in
    fp32, so the top of the distribution (a greedy answer's argmax, what top-p keeps) is the fp32 layer's for the
    same hidden state, and only the tail is approximate."""

    TOP_K = 64

    def __init__(self, weight: torch.nn.Parameter) -> None:
        super().__init__()
        self.weight = weight
        self.approximate = _quantized(weight)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        scores = self.approximate(hidden)
        top = scores.topk(min(self.TOP_K, scores.shape[-1]), dim=-1).indices
        exact = (self.weight[top] @ hidden.unsqueeze(-1)).squeeze(-1)
        return scores.scatter_(-1, top, exact)


def _greedy_head_pays(weight: torch.Tensor) -> tuple[bool, float, float]:
    """Whether the bf16 head is clearly faster than the fp32 one here; (answer, fp32 s, bf16 s)."""
    timings = []
    for w in (weight.detach(), weight.detach().to(torch.bfloat16)):
        x = torch.randn(1, w.shape[1], dtype=w.dtype)
        timings.append(_best_seconds([lambda x=x, w=w: torch.nn.functional.linear(x, w)]))
    fp32_s, bf16_s = timings
    return bf16_s < BF16_MARGIN * fp32_s, fp32_s, bf16_s


class Served:
    """A module tree like the loaded model's, in `dtype`, that generation runs on (see the module's notes)."""

    def __init__(self, model: Any, dtype: torch.dtype, int8: bool = False, background: bool = False,
                 quiet: Quiet | None = None) -> None:
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
        if (not int8 and dtype == torch.float32 and type(head) is torch.nn.Linear and head.bias is None
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
        # whether each adapter can be merged, by (the peft model's id, the adapter's name): asked twice a request,
        # and each answer walks every module (2.3-2.7 ms on a 270M model with 126 LoRA layers)
        self._mergeable: dict[tuple[int, str], bool] = {}
        # chat's int8 copy: the same tree (its other tensors shared), each linear quantized from the served
        # weights; the base's quantized layers by path, and those of the last INT8_ADAPTERS adapters merged
        self.int8: Any = None
        self._int8_base: dict[str, torch.nn.Module] = {}
        self._int8_adapters: OrderedDict[str, dict[str, torch.nn.Module]] = OrderedDict()
        self._lock = threading.Lock()  # the served weights and the int8 copy change together
        self.int8_ready = threading.Event()  # set once the int8 copy is made, or when there is none to make
        self._closed = threading.Event()  # the model was put away: a copy not yet begun is not made
        if int8 and dtype == torch.float32:
            self._make_int8(served, background, quiet)
        else:
            self.int8_ready.set()

    def _make_int8(self, served: Any, background: bool, quiet: Quiet | None) -> None:
        """The int8 copy of the base weights: its module tree now, its layers quantized here or, `background`, in a
        thread while the exact copy answers (on a 256M model with a 262k vocabulary the copy takes seconds, most
        of it packing the output layer), begun once the worker is `quiet` (after the answer that loaded the model:
        made during it, on 2 cores, the copy slowed it); chat switches to it between requests, once it is whole."""
        started = time.monotonic()
        memo: dict[int, Any] = {id(t): t for t in [*served.parameters(), *served.buffers()]}
        fast = copy.deepcopy(served, memo)
        head = fast.get_output_embeddings()
        linears = [(path, module, module is head and module.bias is None)
                   for path, module in fast.named_modules() if type(module) is torch.nn.Linear]

        def make() -> None:
            try:
                if quiet is not None:
                    quiet.wait(at_most_s=INT8_MAX_DEFER_S, stop=self._closed)
                if self._closed.is_set():
                    return
                begun = time.monotonic()
                layers = {path: Int8Head(m.weight) if is_head else _quantized(m.weight, m.bias)
                          for path, m, is_head in linears}
                with self._lock:
                    for path, layer in layers.items():
                        _replace(fast, path, layer)
                    fast.eval()
                    self._int8_base = layers
                    self.int8 = fast
                    if self.adapter is not None and not self.adapter.startswith("\0"):  # merged meanwhile
                        self._merge_int8(self.adapter, self._merged, {})
                log.info("chat's int8 copy made in %.2f s%s", time.monotonic() - begun,
                         f" (in the background, begun {begun - started:.1f} s after the load)" if background else "")
            finally:
                self.int8_ready.set()

        if background:
            threading.Thread(target=make, name="int8-copy", daemon=True).start()
        else:
            make()

    def close(self) -> None:
        """The model is put away (evicted, or the worker ends): an int8 copy still waiting to begin is not made."""
        self._closed.set()

    def _merge_int8(self, adapter: str | None, layers: dict[str, Any], previous: dict[str, Any]) -> None:
        """The int8 copy follows the served weights: the base's layers where the adapter merged nothing, the
        adapter's (quantized from the merged weights, or as made the last time it was asked for) where it did."""
        for path in previous:
            if path not in layers:
                _replace(self.int8, path, self._int8_base[path])
        if adapter is None:
            return
        made = self._int8_adapters.pop(adapter, None)
        if made is None:
            made = {}
            for path in layers:
                module = self._modules[path]
                made[path] = (Int8Head(module.weight) if isinstance(self._int8_base.get(path), Int8Head)
                              else _quantized(module.weight, module.bias))
        self._int8_adapters[adapter] = made
        while len(self._int8_adapters) > INT8_ADAPTERS:
            self._int8_adapters.popitem(last=False)
        for path, module in made.items():
            _replace(self.int8, path, module)

    def can_merge(self, peft_model: Any, adapter: str) -> bool:
        """Whether `adapter` in `peft_model` can be served merged (remembered until it is `forget`-ed)."""
        key = (id(peft_model), adapter)
        found = self._mergeable.get(key)
        if found is None:
            found = self._mergeable[key] = _lora_layers(peft_model, adapter) is not None
        return found

    def forget(self, adapter: str) -> None:
        """The adapter's weights changed (reloaded): merge it again when it is next asked for."""
        self._mergeable = {key: known for key, known in self._mergeable.items() if key[1] != adapter}
        with self._lock:
            if self.adapter == adapter:
                self.adapter = "\0stale"
            self._int8_adapters.pop(adapter, None)

    def merge(self, peft_model: Any, adapter: str | None) -> bool:
        """Set the weights to the base's plus `adapter`'s (None: the base's alone); False when they already were."""
        if adapter == self.adapter:
            return False
        layers = {} if adapter is None else _lora_layers(peft_model, adapter)
        if layers is None:
            raise ValueError(f"adapter {adapter} cannot be merged")
        with self._lock, torch.no_grad():
            for path, layer in self._merged.items():
                if path not in layers:
                    self._set_weight(path, layer.base_layer.weight)
            for path, layer in layers.items():
                base = layer.base_layer.weight
                delta = layer.get_delta_weight(adapter)
                self._set_weight(path, (base.float() + delta.float()).to(base.dtype))
            if self.int8 is not None:
                self._merge_int8(adapter, layers, self._merged)
            self._merged = layers
            self.adapter = adapter
        return True

    def _set_weight(self, path: str, weight: torch.Tensor) -> None:
        module = self._modules[path]
        module._parameters["weight"] = torch.nn.Parameter(weight.detach().to(self.dtype), requires_grad=False)
        if isinstance(module, GreedyHead):  # an adapter on the output layer: its bf16 scores follow
            module.approximate = weight.detach().to(torch.bfloat16)


def _replace(root: torch.nn.Module, path: str, module: torch.nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, name, module)
