"""Loading a job's result for chat, and streaming one answer with `model.generate`.

One base model in memory serves the base model's answers and those of every
LoRA job trained on it: each job's adapter is loaded onto it under its own
name, `set_adapter` picks one, and `disable_adapter()` answers as the base
model. A full fine-tune is its own model; its base is loaded beside it. At most
`MAX_MODELS` models and `MAX_ADAPTERS` adapters per model stay loaded (least
recently used out first). What a job wrote is cached under its folder and its
spec's `fingerprint` (the weights files' sizes and modification times): weights
rewritten on disk load again.

Tokens reach the parent as they are made: a streamer receives each token from
`generate`, detokenises incrementally (a character split across tokens waits
for its last byte) and sends the new text; stop strings are cut out, and text
that may be the start of one is held back until it is not. Cancelling sets a
flag that a StoppingCriteria reads before the next token.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
)
from transformers.generation.streamers import BaseStreamer

from tunestudio.inference_protocol import (
    DEFAULT_MAX_TOKENS,
    Delta,
    Done,
    Generate,
    GenerateParams,
    Loaded,
    ModelSpec,
    Render,
    Rendered,
    Started,
)
from tunestudio.worker import modalities
from tunestudio.worker.errors import UserFacing
from tunestudio.worker.serve import llamacpp
from tunestudio.worker.serve.prompting import chat_prompt, text_tokenizer
from tunestudio.worker.serve.quiet import Quiet
from tunestudio.worker.serve.serving import GreedyHead, Served, int8_chat, serving_dtype

log = logging.getLogger(__name__)
MAX_MODELS = 2
MAX_ADAPTERS = 8


# --- loading ----------------------------------------------------------------------------
def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _dtype(device: str) -> torch.dtype:
    if device == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def _adapter_name(job_id: str) -> str:
    return "job_" + re.sub(r"\W", "_", job_id)  # peft keeps adapters in a ModuleDict: no dots


@dataclass
class _Entry:
    model: Any
    adapters: OrderedDict[str, tuple[str, str]] = field(default_factory=OrderedDict)  # name → (folder, fingerprint)
    served: Served | None = None  # the plain copy generation runs on (None: this model is served as it is)
    llama: llamacpp.Side | None = None  # llama.cpp's copy, where it serves this model's chat (serve/llamacpp.py)

    def close(self) -> None:
        if self.served is not None:
            self.served.close()
        if self.llama is not None:
            self.llama.close()


class Models:
    """What is in memory: models by what they were loaded from (and its fingerprint), tokenizers by folder too."""

    def __init__(self, replies: Any, cache_dir: str | None = None) -> None:
        self.replies = replies
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.device = _device()
        self._models: OrderedDict[tuple[str, str, bool], _Entry] = OrderedDict()
        self._tokenizers: dict[tuple[str, str], Any] = {}
        self.quiet = Quiet()  # the worker's requests (`with models.quiet:`): background work begins between them

    def close(self) -> None:
        """Put away what the models hold outside Python's reach (llama.cpp's engines)."""
        for entry in self._models.values():
            entry.close()
        self._models.clear()

    def tokenizer(self, folder: str, fingerprint: str = "", modality: str = "text") -> Any:
        key = (folder, fingerprint)
        if key not in self._tokenizers:
            processor_class, _ = modalities.named(modality).serving_loaders()
            try:
                tokenizer = processor_class.from_pretrained(folder, local_files_only=True)
            except (OSError, ValueError) as exc:
                raise UserFacing(f"cannot load the tokenizer from {folder}: {exc}", 409, "model_unavailable") from None
            text = text_tokenizer(tokenizer)  # an image model's processor holds its tokenizer
            if text.pad_token is None:
                text.pad_token = text.eos_token
            self._tokenizers = {k: v for k, v in self._tokenizers.items() if k[0] != folder}  # an older fingerprint's
            self._tokenizers[key] = tokenizer
        return self._tokenizers[key]

    def _load(self, name: str, load_in_4bit: bool, fingerprint: str = "", modality: str = "text") -> _Entry:
        key = (name, fingerprint, load_in_4bit)
        entry = self._models.pop(key, None)
        if entry is None:
            for stale in [k for k in self._models if k[0] == name and k[1] != fingerprint]:
                self._models.pop(stale).close()  # the same folder's weights as they were: rewritten on disk since
            while len(self._models) >= MAX_MODELS:
                self._models.popitem(last=False)[1].close()
                if self.device == "cuda":
                    torch.cuda.empty_cache()
            started = time.monotonic()
            kwargs: dict[str, Any] = {"dtype": _dtype(self.device)}
            if load_in_4bit:
                from transformers import BitsAndBytesConfig

                kwargs["quantization_config"] = BitsAndBytesConfig(
                    load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                    bnb_4bit_compute_dtype=_dtype(self.device) if self.device == "cuda" else torch.float32)
                kwargs["device_map"] = {"": self.device}
            _, model_class = modalities.named(modality).serving_loaders()
            try:
                model = model_class.from_pretrained(name, local_files_only=True, **kwargs)
            except (OSError, ValueError) as exc:
                raise UserFacing(f"cannot load the model {name}: {exc}", 409, "model_unavailable") from None
            if not load_in_4bit:
                model.to(self.device)
            model.eval()
            entry = _Entry(model, served=None if load_in_4bit else Served(
                model, serving_dtype(model, self.device), int8=int8_chat(model, self.device), background=True,
                quiet=self.quiet))
            self.replies.put(Loaded(name, self.device, time.monotonic() - started))
        self._models[key] = entry  # most recently used last
        return entry

    def for_spec(self, spec: ModelSpec, chat: bool = False) -> tuple[Any, Any, bool]:
        """(model, tokenizer, adapter off) for a spec, loading what is missing. `chat`: the model a chat answer
        generates with (the int8 copy where there is one); otherwise the exact one (log-probabilities)."""
        tokenizer = self.tokenizer(spec.tokenizer, spec.fingerprint if spec.tokenizer == spec.weights else "",
                                   spec.modality)
        if spec.kind == "full":
            if spec.base:
                return (self._serve(self._load(spec.base_model, spec.load_in_4bit, modality=spec.modality), None,
                                    chat), tokenizer, False)
            entry = self._load(spec.weights, spec.load_in_4bit, spec.fingerprint, spec.modality)
            return self._serve(entry, None, chat), tokenizer, False
        entry = self._load(spec.base_model, spec.load_in_4bit, modality=spec.modality)
        if spec.base:
            from peft import PeftModel

            if entry.served is not None:
                return self._serve(entry, None, chat), tokenizer, False
            return entry.model, tokenizer, isinstance(entry.model, PeftModel)
        name = _adapter_name(spec.job_id)
        if entry.adapters.get(name) != (spec.weights, spec.fingerprint):
            self._add_adapter(entry, name, spec.weights, spec.fingerprint)
        entry.adapters.move_to_end(name)
        if entry.served is not None and entry.served.can_merge(entry.model, name):
            return self._serve(entry, name, chat), tokenizer, False
        if entry.model.active_adapter != name:  # set_adapter walks every module: only when it changes
            entry.model.set_adapter(name)
        return entry.model, tokenizer, False

    def _serve(self, entry: _Entry, adapter: str | None, chat: bool = False) -> Any:
        """The model to generate with: the entry's served copy with `adapter` merged (None: the base; `chat`: its
        int8 copy where it has one), or the entry's own model when it has no served copy (4-bit weights)."""
        if entry.served is None:
            return entry.model
        started = time.monotonic()
        if entry.served.merge(entry.model, adapter):
            log.info("serving %s in %s (merged in %.2f s)", adapter or "the base model", entry.served.dtype,
                     time.monotonic() - started)
        if chat and entry.served.int8 is not None:
            return entry.served.int8
        return entry.served.model

    def llama_for(self, spec: ModelSpec, tokenizer: Any, ids: list[int],
                  threads: int) -> tuple[llamacpp.Engine, str | None] | None:
        """llama.cpp's engine and the adapter to set on it where llama.cpp answers this chat request (after
        `for_spec` loaded the model and `tokenizer`, its text tokenizer, made the prompt's `ids`); None: PyTorch
        answers (see serve/llamacpp.py for when)."""
        choice = llamacpp.engine_setting()
        if (choice == "torch" or self.device != "cpu" or spec.load_in_4bit or spec.modality != "text"
                or self.cache_dir is None):
            return None
        own = spec.kind == "full" and not spec.base
        name = spec.weights if own else spec.base_model
        entry = self._models.get((name, spec.fingerprint if own else "", False))
        if entry is None or entry.served is None:
            return None
        adapter = None if spec.base or spec.kind == "full" else _adapter_name(spec.job_id)
        if adapter is not None and not entry.served.can_merge(entry.model, adapter):
            return None  # what llama.cpp's adapters cannot express either (DoRA, whole modules saved, ...)
        if entry.llama is None:
            if not llamacpp.installed():
                if choice == "llama.cpp":
                    raise UserFacing(f"{llamacpp.ENGINE_ENV}=llama.cpp, but {llamacpp.INSTALL_HINT}", 503,
                                     "inference_unavailable")
                return None
            params = sum(p.numel() for p in entry.model.parameters())
            if choice == "auto" and params < llamacpp.MIN_PARAMS:
                return None
            folder = llamacpp.local_folder(name)  # a hub id's snapshot in the local cache
            if folder is None:
                return None
            n_ctx = min(context_length(entry.model, tokenizer), llamacpp.MAX_CONTEXT)
            forced = choice == "llama.cpp"  # else made while PyTorch answers: below its priority
            files = llamacpp.Files(self.cache_dir / "gguf", nice=0 if forced else llamacpp.BACKGROUND_NICE)
            low, high = llamacpp.MERGE_PARAMS
            merge = not forced and low <= params <= high
            entry.llama = llamacpp.Side(files, folder, n_ctx, threads, forced=forced, quiet=self.quiet, merge=merge)
            if entry.llama.state == "serving":
                self._announce(entry.llama)
        side = entry.llama
        # auto: measured once, against the chat copy (once made: until then PyTorch's exact copy answers)
        if side.state == "loaded" and side.engine is not None and entry.served.int8_ready.is_set():
            chat = entry.served.int8 if entry.served.int8 is not None else entry.served.model
            probe = ids[:2 * llamacpp.PROBE_TOKENS]
            if side.decide(side.engine.token_seconds(probe, threads), _token_seconds(chat, probe)):
                self._announce(side)
        if side.state != "serving" or side.engine is None:
            return None
        if adapter is not None:
            merged, new = side.merged(spec.weights, spec.fingerprint)
            if merged is not None:  # the job's own merged copy: no adapter's products in its prefill
                if new:
                    self.replies.put(Loaded(f"{spec.weights} (llama.cpp merged {llamacpp.MODEL_TYPE})", self.device,
                                            0.0))
                return merged, None
            held = side.adapter(adapter, spec.weights, spec.fingerprint, side.folder)
            if not held:
                return None
            if held == "added":
                self.replies.put(Loaded(f"{spec.weights} (llama.cpp adapter)", self.device, 0.0))
            side.begin_merge(spec.weights, spec.fingerprint, side.folder)
        return side.engine, adapter

    def _announce(self, side: llamacpp.Side) -> None:
        self.replies.put(Loaded(f"{side.folder} (llama.cpp {llamacpp.MODEL_TYPE})", self.device, side.load_seconds))

    def _add_adapter(self, entry: _Entry, name: str, folder: str, fingerprint: str) -> None:
        from peft import PeftModel

        if not (Path(folder) / "adapter_config.json").is_file():
            raise UserFacing(f"the adapter folder {folder} is gone", 409, "model_unavailable")
        started = time.monotonic()
        try:
            if isinstance(entry.model, PeftModel):
                if name in entry.adapters:  # the same job's weights, another folder or rewritten on disk
                    entry.model.delete_adapter(name)
                    del entry.adapters[name]
                while len(entry.adapters) >= MAX_ADAPTERS:
                    oldest, _ = entry.adapters.popitem(last=False)
                    entry.model.delete_adapter(oldest)
                entry.model.load_adapter(folder, adapter_name=name)
            else:
                entry.model = PeftModel.from_pretrained(entry.model, folder, adapter_name=name)
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            raise UserFacing(f"cannot load the adapter in {folder}: {exc}", 409, "model_unavailable") from None
        entry.model.eval()
        entry.adapters[name] = (folder, fingerprint)
        if entry.served is not None:
            entry.served.forget(name)
        self.replies.put(Loaded(f"{folder} (adapter)", self.device, time.monotonic() - started))


def _token_seconds(model: Any, ids: list[int]) -> float:
    """One token's forward pass with the KV cache after `ids`, the best of `PROBE_TOKENS` (llama.cpp's probe)."""
    best = float("inf")
    with torch.inference_mode():
        cache = model(input_ids=torch.tensor([ids]), use_cache=True).cache
        for token in ids[:llamacpp.PROBE_TOKENS]:
            started = time.perf_counter()
            cache = model(input_ids=torch.tensor([[token]]), cache=cache, use_cache=True).cache
            best = min(best, time.perf_counter() - started)
    return best


# --- prompts ------------------------------------------------------------------------------
def render(models: Models, request: Render, replies: Any, halt: threading.Event) -> None:
    """The prompt `answer` would give the model for these messages, decoded with its special tokens: Rendered, Done.
    Only the tokenizer loads."""
    spec = request.spec
    tokenizer = models.tokenizer(spec.tokenizer, spec.fingerprint if spec.tokenizer == spec.weights else "",
                                 spec.modality)
    ids = chat_prompt(tokenizer, request.messages, request.tools, request.images).ids
    text = text_tokenizer(tokenizer).decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None
    replies.put(Rendered(request.request_id, text, len(ids), template))
    replies.put(Done(request.request_id, "stop", len(ids), 0))


def context_length(model: Any, tokenizer: Any) -> int:
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()  # an image model's language model's (a text model's own config)
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    limit = getattr(tokenizer, "model_max_length", None)
    return limit if isinstance(limit, int) and 0 < limit < 10**7 else 4096


# --- streaming ----------------------------------------------------------------------------
class _Halt(StoppingCriteria):
    """Stops generate at the next token once the flag is set (a cancel, or a stop string seen)."""

    def __init__(self, *flags: threading.Event) -> None:
        self.flags = flags

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        stop = any(f.is_set() for f in self.flags)
        return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)


class _NoEndBefore(LogitsProcessor):
    """min_new_tokens as generate's own processor applies it (end tokens' scores -inf until `until` tokens), on
    the end tokens' columns alone."""

    def __init__(self, until: int, eos: list[int]) -> None:
        self.until = until
        self.eos = eos

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if input_ids.shape[-1] < self.until and self.eos:
            scores[:, self.eos] = float("-inf")
        return scores


class TextStream(BaseStreamer):
    """Receives tokens from `generate` and sends text deltas, minus stop strings. Special tokens are left out of
    the text, but for those named in `keep` (a tool-call family's markers, where they are special tokens)."""

    def __init__(self, tokenizer: Any, send: Any, stops: list[str], keep: tuple[str, ...] = ()) -> None:
        self.tokenizer = tokenizer
        self.send = send
        self.stops = [s for s in stops if s]
        special = set(tokenizer.all_special_ids)
        kept = {tokenizer.convert_tokens_to_ids(t) for t in keep} & special
        self.drop = special - kept if kept else None  # None: skip every special token, as decode does
        self.ids: list[int] = []
        self.prompt_seen = False
        self._prefix = 0  # ids[_prefix:_read] decode to text already accounted for
        self._read = 0
        self.text = ""  # decoded so far (stop strings not yet cut)
        self.sent = 0  # characters of self.text already sent
        self.stopped = threading.Event()  # a stop string was found

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:  # generate hands over the prompt first
            self.prompt_seen = True
            return
        self.add(value.reshape(-1).tolist())

    def add(self, ids: list[int]) -> None:
        """New tokens (llama.cpp's, one at a time; generate's through `put`)."""
        if self.stopped.is_set():
            return
        self.ids.extend(ids)
        before = self._decode(self.ids[self._prefix : self._read])
        now = self._decode(self.ids[self._prefix :])
        if len(now) <= len(before) or now.endswith("\ufffd"):
            return  # nothing new, or half a character: wait for the next token
        self.text += now[len(before) :]
        self._prefix, self._read = self._read, len(self.ids)
        self._flush(final=False)

    def end(self) -> None:
        if not self.stopped.is_set():  # what waited for a character's last byte: as it decodes now
            before = self._decode(self.ids[self._prefix : self._read])
            now = self._decode(self.ids[self._prefix :])
            self.text += now[len(before) :]
        self._flush(final=True)

    def _decode(self, ids: list[int]) -> str:
        if self.drop is None:
            return self.tokenizer.decode(ids, skip_special_tokens=True)
        return self.tokenizer.decode([i for i in ids if i not in self.drop], skip_special_tokens=False)

    def _flush(self, final: bool) -> None:
        if self.stopped.is_set():
            return
        upto = len(self.text)
        for stop in self.stops:
            found = self.text.find(stop, max(0, self.sent - len(stop) + 1))
            if found != -1 and found < upto:
                upto = found
                self.stopped.set()
        if not self.stopped.is_set() and not final:
            upto -= held_back(self.text, self.stops)  # may be the beginning of a stop string
        if upto > self.sent:
            self.send(self.text[self.sent : upto])
            self.sent = upto


def held_back(text: str, stops: list[str]) -> int:
    """How many characters at the end of `text` begin some stop string (held back until the next token says
    whether the stop string follows; chat and completions both)."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if stop.startswith(text[-n:]):
                longest = n
                break
    return longest


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    ids = getattr(model.generation_config, "eos_token_id", None)
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


def answer(models: Models, request: Generate, replies: Any, halt: threading.Event) -> None:
    """Answer one request: Started, Deltas, Done (or UserFacing raised before Started)."""
    params = GenerateParams.model_validate(request.params)
    model, tokenizer, base_off = models.for_spec(request.spec, chat=True)
    if torch.get_num_threads() != request.threads:
        torch.set_num_threads(request.threads)
    prompt = chat_prompt(tokenizer, request.messages, request.tools, request.images)
    tokenizer = text_tokenizer(tokenizer)
    ids = prompt.ids
    limit = context_length(model, tokenizer)
    if len(ids) >= limit:
        raise UserFacing(f"messages: the prompt is {len(ids)} tokens, and the model's context is {limit}",
                         400, "context_length_exceeded")
    max_new = min(params.max_tokens or DEFAULT_MAX_TOKENS, limit - len(ids))
    route = None if prompt.inputs else models.llama_for(request.spec, tokenizer, ids, request.threads)
    if route is not None and len(ids) + max_new > route[0].n_ctx:
        route = None  # longer than llama.cpp's context holds: PyTorch's, which has the model's whole context
    rid = request.request_id
    replies.put(Started(rid, len(ids), request.threads if route else torch.get_num_threads(),
                        prompt.family.name if prompt.family else None, prompt.think, prompt.think_open, prompt.prefix))

    stream = TextStream(tokenizer, lambda text: replies.put(Delta(rid, text)), params.stop, prompt.keep)
    eos = _eos_ids(model, tokenizer)
    min_new = min(params.min_tokens, max_new)
    if route is not None:
        engine, adapter = route
        new = engine.generate(ids, adapter, max_new, min_new, eos, params.temperature, params.top_p, params.seed,
                              request.threads, lambda token: stream.add([token]),
                              lambda: halt.is_set() or stream.stopped.is_set())
        stream.end()
    else:
        new = _generate(model, base_off, ids, prompt.inputs, eos, min_new, max_new, params,
                        stream, StoppingCriteriaList([_Halt(halt, stream.stopped)]))
    if halt.is_set() and not stream.stopped.is_set():
        reason = "cancelled"
    elif stream.stopped.is_set() or (new and new[-1] in eos):
        reason = "stop"
    else:
        reason = "length" if len(new) >= max_new else "stop"
    replies.put(Done(rid, reason, len(ids), len(new)))


def _generate(model: Any, base_off: bool, ids: list[int], images: dict[str, Any], eos: list[int], min_new: int,
              max_new: int, params: GenerateParams, stream: TextStream, stopping: StoppingCriteriaList) -> list[int]:
    """PyTorch's answer: the new tokens `model.generate` made (each streamed to `stream` as it is made)."""
    tokenizer = stream.tokenizer
    sampling = params.temperature > 0
    if sampling and params.seed is not None:
        torch.manual_seed(params.seed)
    device = next(model.parameters()).device
    inputs = torch.tensor([ids], device=device)
    extra = {name: value.to(device) for name, value in images.items()}  # an image model's pixels
    kwargs: dict[str, Any] = {
        "max_new_tokens": max_new,
        "do_sample": sampling,
        "use_cache": True,
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": eos,
        "streamer": stream,
        "stopping_criteria": stopping,
    }
    if sampling:
        kwargs.update(temperature=params.temperature, top_p=params.top_p, top_k=0, min_new_tokens=min_new or None)
    else:  # greedy: no sampling knobs, or generate warns that they are unused
        kwargs.update(temperature=None, top_p=None, top_k=None)
        # min_new_tokens' own processor builds a vocabulary-sized mask every token (~3 passes over 262k scores);
        # for an argmax, where it runs among the processors changes nothing
        kwargs["logits_processor"] = LogitsProcessorList([_NoEndBefore(len(ids) + min_new, eos)])
    head = model.get_output_embeddings()
    fast_head = head.greedy() if isinstance(head, GreedyHead) and not sampling else contextlib.nullcontext()
    with torch.inference_mode(), fast_head:
        if base_off:
            with model.disable_adapter():
                output = model.generate(inputs, attention_mask=torch.ones_like(inputs), **extra, **kwargs)
        else:
            output = model.generate(inputs, attention_mask=torch.ones_like(inputs), **extra, **kwargs)
    return output[0, len(ids):].tolist()
