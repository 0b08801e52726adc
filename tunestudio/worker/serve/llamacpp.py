"""Chat through llama.cpp (issue 40): a text model's tokens decoded by llama.cpp, from GGUF copies this worker makes.

Why: a token of a 270M model with a 262k vocabulary took 30.6 ms through PyTorch's int8 copy against 18 ms in
llama.cpp's q8_0 on the same file (bench/RESULTS.md, issue 29): the difference is Python between PyTorch's kernels.

What: llama.cpp through llama-cpp-python's low-level API (a model, a context, the decode loop here), the binding
built from its pinned, hash-checked sdist by `make llamacpp` (not by `make setup`: it compiles llama.cpp, minutes
on 2 cores). A base model (or a full fine-tune) becomes `model-q8_0.gguf`, and a LoRA job `adapter-f32.gguf` set on
the base's context per request, so one base's file serves all its jobs and `:base`. Both are written by llama.cpp's
own converters (worker/converter.py, as the export runs them) into the data directory's cache folder (`gguf/`),
under a key of the folder and its weights' fingerprint: weights rewritten on disk get new files, and the old ones
are removed, as are the copies of folders that are gone (a deleted job's), each time a file is made (the cache is
this studio's own; nothing outside it is written or removed).

Only the forward passes and the choice of each token are llama.cpp's. The prompt's ids, the end tokens,
`min_tokens` (end tokens' scores -inf until then), stop strings, cancel and the text stream are generation.py's,
as for PyTorch. Greedy: the argmax of the scores. Sampling: llama.cpp's own temperature, top-p and seeded draw
(a seed repeats its answer; not PyTorch's answer for that seed).

When (`TUNESTUDIO_CHAT_ENGINE`):
- auto (the default): on a CPU, for a text model of `MIN_PARAMS` or more that PyTorch serves merged (`Served`),
  with llama-cpp-python installed. The files are made and loaded in a thread, PyTorch answering meanwhile: begun
  once the worker has answered no request for a second (quiet.py: `QUIET_S`, or `MAX_DEFER_S` under load), the
  converter `BACKGROUND_NICE` steps below the worker's priority, so the answers a user waits for are not slowed; at
  the next request for the model once chat's int8 copy is made, one token's decode is timed on both
  (`PROBE_TOKENS`), and llama.cpp answers from then on where it is faster. A job whose adapter has no file yet
  answers through PyTorch while it is made. Once a job's adapter serves, a model of `MERGE_PARAMS` also gets the
  job's merged copy (`merged-q8_0-<base's key>.gguf`: what its own q8_0 export holds), made and loaded the same
  way, one at a time: the adapter set on the base's context cost llama.cpp's prefill 15-23 % (bench/RESULTS.md).
  The base's engine still answers `:base` and the other jobs; beside it, one merged engine answers and at most one
  more waits for its job's next request. `MERGED_FILES` are kept, the least recently asked for removed.
- llama.cpp: every chat request it can serve, its files made before the answer (the tests use it on the tiny
  model); 503 when the binding is not installed, or a copy cannot be made.
- torch: never.
Log-probabilities (`/v1/completions`), reward scores, image models, 4-bit models and requests whose prompt and
`max_tokens` together pass the context (`MAX_CONTEXT` at most) stay PyTorch's, as do base models named by a hub id
that is not in the local cache (the converter reads a folder).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tunestudio.checkpoints import fingerprint
from tunestudio.process import pid_alive
from tunestudio.worker.converter import driver, driver_env, require_converter, run_child
from tunestudio.worker.errors import UserError, UserFacing
from tunestudio.worker.serve.quiet import Quiet

log = logging.getLogger(__name__)
ENGINE_ENV = "TUNESTUDIO_CHAT_ENGINE"
ENGINES = ("auto", "torch", "llama.cpp")
MODEL_TYPE = "q8_0"  # what llama.cpp's CPU users run, and what bench/inference.py compares with
ADAPTER_TYPE = "f32"  # a LoRA's matrices are small: kept exact
MIN_PARAMS = 50_000_000  # below, PyTorch's answers stay (serving.py's INT8_MIN_PARAMS, for the same reason)
MAX_CONTEXT = 4096  # the context's KV memory is allocated whole: 75 MB at this length for a 270M Gemma shape
BATCH = 512
PROBE_TOKENS = 8
MAX_ADAPTERS = 8
# A LoRA job's adapter set on the base's context costs its prefill 15-23 % (llama.cpp computes each of its pairs as two
# more products: bench/RESULTS.md, issue 40), so auto also makes the job chatted with a merged copy, at the cost of a
# whole q8_0 copy per job: for models of this size range only, at most `MERGED_FILES` kept on disk
MERGE_PARAMS = (50_000_000, 1_000_000_000)
MERGED_FILES = 2
MERGING = threading.Lock()  # one merged copy made at a time in a worker (a fp32 merge: 4 bytes a parameter)
# auto makes its files while PyTorch answers: a converter begun with the first answer, at normal priority, took
# that answer of the real-shaped model from a median of 2.5 s (PyTorch alone) to 3.4 s (2.5-4.5) on 2 cores
# (bench/RESULTS.md); it also begins only once the worker is quiet (quiet.py)
BACKGROUND_NICE = 10
INSTALL_HINT = "llama-cpp-python is not installed in this environment; `make llamacpp` builds it"


def engine_setting() -> str:
    choice = os.environ.get(ENGINE_ENV, "auto").strip().lower()
    choice = {"llamacpp": "llama.cpp", "llama": "llama.cpp", "pytorch": "torch"}.get(choice, choice)
    if choice not in ENGINES:
        log.warning("%s=%s is not one of %s: auto", ENGINE_ENV, choice, ", ".join(ENGINES))
        return "auto"
    return choice


def local_folder(name: str) -> str | None:
    """The folder holding the model `name` names: itself, or a hub id's snapshot in the local cache (where the
    worker loaded it from); None when there is none here."""
    if Path(name).is_dir():
        return name
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(name, local_files_only=True)
    except Exception:  # not a hub id, or not downloaded: the converter has nothing to read
        return None


@functools.cache
def installed() -> bool:
    """Whether the binding and the converters are here (asked once a worker: neither comes or goes while it runs)."""
    try:
        require_converter()
    except UserError:
        return False
    return importlib.util.find_spec("llama_cpp") is not None


def llama_cpp_flag(function: str, model: Any) -> bool:
    """A yes/no question llama.cpp answers about a loaded model (False where this binding lacks the function)."""
    import llama_cpp

    ask = getattr(llama_cpp, function, None)
    return bool(ask(model)) if ask is not None else False


# --- files ------------------------------------------------------------------------------------
class Stopped(Exception):
    """The model a file was being made for was put away."""


def _unless(stop: threading.Event | None) -> None:
    if stop is not None and stop.is_set():
        raise Stopped("the model was put away")


class Files:
    """GGUF copies of models and adapters, made once, kept under `root` (the cache folder's `gguf/`); the converter
    runs `nice` steps lower in priority (auto's files, made while PyTorch answers)."""

    def __init__(self, root: Path, nice: int = 0) -> None:
        self.root = root
        self.nice = nice

    def model(self, folder: str) -> Path:
        """`folder`'s model as `model-q8_0.gguf`, made now if it is not there."""
        return self._made(folder, f"model-{MODEL_TYPE}.gguf", lambda out, scratch: [
            *driver("hf", Path(folder)), folder, "--outtype", MODEL_TYPE, "--outfile", str(out)])

    def adapter(self, folder: str, base: str) -> Path:
        """The LoRA adapter in `folder` as `adapter-f32.gguf` (its base's config read from `base`)."""
        return self._made(folder, f"adapter-{ADAPTER_TYPE}.gguf", lambda out, scratch: [
            *driver("lora", None), "--outtype", ADAPTER_TYPE, "--outfile", str(out), "--base", base, folder])

    def merged(self, folder: str, base: str, stop: threading.Event | None = None) -> Path:
        """The LoRA adapter in `folder` merged into the model in `base`, as `merged-q8_0-<base's key>.gguf`: what
        the job's own GGUF export holds (fp32 merge, then q8_0); its making ends when `stop` is set. At most
        `MERGED_FILES` such copies are kept: the least recently asked for go. The caller holds `MERGING` until
        the file is open (another side's making removes the least recent)."""
        name = f"merged-{MODEL_TYPE}-{self.place(base)[2].name}.gguf"
        path = self._made(folder, name, lambda out, scratch: [
            *driver("merged", None), folder, base, str(scratch), "--outtype", MODEL_TYPE, "--outfile", str(out)],
            stop)
        os.utime(path)  # its time is when it was last asked for
        copies = sorted(self.root.glob(f"*/merged-{MODEL_TYPE}-*.gguf"), key=lambda p: p.stat().st_mtime_ns)
        for old in [c for c in copies if c != path][:max(len(copies) - MERGED_FILES, 0)]:
            old.unlink(missing_ok=True)  # an engine still reading it keeps it until it is put away
        return path

    def _made(self, folder: str, name: str, command: Callable[[Path, Path], list[str]],
              stop: threading.Event | None = None) -> Path:
        """`name` in `folder`'s cache folder, made by the child `command(partial, scratch)` if it is not there:
        written as `partial`, renamed into place once whole; `scratch`, a folder the child may make, is removed.
        The child is ended when `stop` is set."""
        from tunestudio.settings import private_dir

        source, stamp, place = self.place(folder)
        path = place / name
        if path.is_file():
            return path
        private_dir(self.root)
        self._drop_stale(source, place)
        place.mkdir(exist_ok=True)
        for left in place.glob(f".{name}.*.tmp*"):  # a partial of ours (below) whose worker was killed making it
            with contextlib.suppress(ValueError, OSError):
                pid = int(left.name.removeprefix(f".{name}.").split(".")[0])
                if not pid_alive(pid):
                    shutil.rmtree(left) if left.is_dir() else left.unlink()
        (place / "source.json").write_text(json.dumps({"folder": source, "fingerprint": stamp}))
        partial = place / f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"
        scratch = partial.with_name(partial.name + ".d")
        started = time.monotonic()
        try:
            run_child(command(partial, scratch), driver_env(),
                      lambda message: log.warning("GGUF converter: %s", message), lambda: _unless(stop),
                      nice=self.nice)
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)
            shutil.rmtree(scratch, ignore_errors=True)
        log.info("GGUF %s of %s made in %.1f s", name, folder, time.monotonic() - started)
        return path

    def place(self, folder: str) -> tuple[str, str, Path]:
        """`folder` resolved, its weights' fingerprint, and the cache folder of their copies."""
        source = str(Path(folder).resolve())
        stamp = fingerprint(Path(folder))
        return source, stamp, self.root / hashlib.sha256(f"{source}\0{stamp}".encode()).hexdigest()[:24]

    def _drop_stale(self, source: str, keep: Path) -> None:
        """Remove this cache's copies of `source` as its weights were before (another fingerprint), and those of
        folders that are gone (a deleted job's adapter)."""
        for other in self.root.iterdir() if self.root.is_dir() else ():
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):  # not a copy of ours: left alone
                folder = json.loads((other / "source.json").read_text())["folder"]
                if other != keep and (folder == source or not Path(folder).exists()):
                    shutil.rmtree(other)


# --- the engine ---------------------------------------------------------------------------------
class Engine:
    """One GGUF model in llama.cpp, one context on it, the LoRA adapters loaded onto it (by name), and the tokens
    its KV memory holds (a prompt that begins as the last one did is not computed again)."""

    def __init__(self, path: Path, n_ctx: int, threads: int) -> None:
        import numpy as np
        from llama_cpp import Llama

        self._np = np
        # flash attention: a 231-token prompt's prefill 499-579 ms against 636-678 without, decode the same
        # (the real-shaped model, 2 threads; bench/RESULTS.md)
        self.llama = Llama(model_path=str(path), n_ctx=n_ctx, n_batch=BATCH, n_threads=threads,
                           n_threads_batch=threads, flash_attn=True, verbose=False)
        self.n_ctx = n_ctx
        self.n_vocab = self.llama.n_vocab()
        self._adapters: OrderedDict[str, tuple[Any, tuple[str, str]]] = OrderedDict()
        self._active: str | None = None
        self._tokens: list[int] = []
        self._threads = threads
        model = self.llama.model
        # a recurrent or hybrid model's state cannot be cut back to a prefix: each prompt is computed whole
        self._reuse = not (llama_cpp_flag("llama_model_is_recurrent", model)
                           or llama_cpp_flag("llama_model_is_hybrid", model))

    # adapters
    def has_adapter(self, name: str, key: tuple[str, str]) -> bool:
        """Whether `name` holds the adapter `key` (folder, fingerprint); it becomes the most recently used."""
        found = self._adapters.get(name)
        if found is None or found[1] != key:
            return False
        self._adapters.move_to_end(name)
        return True

    def add_adapter(self, name: str, path: Path, key: tuple[str, str]) -> None:
        import llama_cpp

        self.drop_adapter(name)
        while len(self._adapters) >= MAX_ADAPTERS:
            self.drop_adapter(next(iter(self._adapters)))
        pointer = llama_cpp.llama_adapter_lora_init(self.llama.model, str(path).encode())
        if not pointer:
            raise UserFacing(f"llama.cpp could not load the adapter {path}", 409, "model_unavailable")
        self._adapters[name] = (pointer, key)

    def drop_adapter(self, name: str) -> None:
        import llama_cpp

        found = self._adapters.pop(name, None)
        if found is None:
            return
        if self._active == name:
            self._use(None)
        llama_cpp.llama_adapter_lora_free(found[0])

    def _use(self, adapter: str | None) -> None:
        import llama_cpp

        if adapter == self._active:
            return
        ctx = self.llama.ctx
        if adapter is None:
            code = llama_cpp.llama_set_adapters_lora(ctx, None, 0, None)
        else:
            pointers = (llama_cpp.llama_adapter_lora_p_ctypes * 1)(self._adapters[adapter][0])
            code = llama_cpp.llama_set_adapters_lora(ctx, pointers, 1, (ctypes.c_float * 1)(1.0))
        if code != 0:
            raise RuntimeError(f"llama.cpp refused the adapter {adapter} ({code})")
        self._active = adapter
        self._forget()

    # decoding
    def _forget(self) -> None:
        import llama_cpp

        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.llama.ctx), True)
        self._tokens = []

    def _decode(self, tokens: list[int]) -> None:
        import llama_cpp

        for start in range(0, len(tokens), BATCH):
            chunk = tokens[start:start + BATCH]
            array = (llama_cpp.llama_token * len(chunk))(*chunk)
            code = llama_cpp.llama_decode(self.llama.ctx, llama_cpp.llama_batch_get_one(array, len(chunk)))
            if code != 0:
                self._forget()
                raise RuntimeError(f"llama.cpp's decode failed ({code})")
            self._tokens.extend(chunk)

    def _prefill(self, ids: list[int]) -> None:
        """The KV memory made to hold `ids`, its scores those of their last position."""
        import llama_cpp

        keep = 0
        for mine, theirs in zip(self._tokens if self._reuse else [], ids[:-1], strict=False):  # the last is computed
            if mine != theirs:  # again: its scores
                break
            keep += 1
        if keep < len(self._tokens):
            memory = llama_cpp.llama_get_memory(self.llama.ctx)
            if keep and llama_cpp.llama_memory_seq_rm(memory, 0, keep, -1) and \
                    llama_cpp.llama_memory_seq_pos_max(memory, 0) == keep - 1:
                del self._tokens[keep:]
            else:  # nothing kept, or the memory could not be cut there
                self._forget()
                keep = 0
        self._decode(ids[keep:])

    def _scores(self) -> Any:
        import llama_cpp

        pointer = llama_cpp.llama_get_logits_ith(self.llama.ctx, -1)
        return self._np.ctypeslib.as_array(pointer, shape=(self.n_vocab,))

    def _threads_for(self, threads: int) -> None:
        import llama_cpp

        if threads != self._threads:
            llama_cpp.llama_set_n_threads(self.llama.ctx, threads, threads)
            self._threads = threads

    def generate(self, ids: list[int], adapter: str | None, max_new: int, min_new: int, eos: list[int],
                 temperature: float, top_p: float, seed: int | None, threads: int,
                 emit: Callable[[int], None], stopped: Callable[[], bool]) -> list[int]:
        """Up to `max_new` tokens after `ids` (each handed to `emit` as it is made), until an end token or
        `stopped()`; returns them. Greedy at temperature 0."""
        import llama_cpp

        self._threads_for(threads)
        self._use(adapter)
        sampler = None
        if temperature > 0:
            sampler = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
            # as transformers orders them: temperature, then top-p on the tempered distribution, then the draw
            llama_cpp.llama_sampler_chain_add(sampler, llama_cpp.llama_sampler_init_temp(temperature))
            if top_p < 1.0:
                llama_cpp.llama_sampler_chain_add(sampler, llama_cpp.llama_sampler_init_top_p(top_p, 1))
            llama_cpp.llama_sampler_chain_add(sampler, llama_cpp.llama_sampler_init_dist(
                llama_cpp.LLAMA_DEFAULT_SEED if seed is None else seed % 2**32))
        new: list[int] = []
        try:
            self._prefill(ids)
            while len(new) < max_new and not stopped():
                scores = self._scores()
                if len(new) < min_new and eos:
                    scores[eos] = float("-inf")  # the sampler reads these same scores
                token = (int(scores.argmax()) if sampler is None
                         else int(llama_cpp.llama_sampler_sample(sampler, self.llama.ctx, -1)))
                new.append(token)
                emit(token)
                if token in eos or len(new) >= max_new or stopped():
                    break
                self._decode([token])
        finally:
            if sampler is not None:
                llama_cpp.llama_sampler_free(sampler)
        return new

    def token_seconds(self, ids: list[int], threads: int) -> float:
        """One token's decode after `ids`, the best of `PROBE_TOKENS` (its KV memory forgotten after)."""
        self._threads_for(threads)
        self._use(None)
        self._forget()
        self._decode(ids)
        best = float("inf")
        for token in ids[:PROBE_TOKENS]:
            started = time.perf_counter()
            self._decode([token])
            best = min(best, time.perf_counter() - started)
        self._forget()
        return best

    def close(self) -> None:
        for name in list(self._adapters):
            self.drop_adapter(name)
        self.llama.close()


# --- one loaded model's llama.cpp side -------------------------------------------------------------
class Side:
    """llama.cpp's side of one model the worker holds (generation.py's `_Entry`): its file made and its engine
    loaded in a thread (auto) or before the answer (llama.cpp), then measured against PyTorch once (auto), and the
    adapters' files likewise. `state`: making, loaded (not yet measured), serving, slower, failed."""

    def __init__(self, files: Files, folder: str, n_ctx: int, threads: int, forced: bool,
                 quiet: Quiet | None = None, merge: bool = False) -> None:
        self.files = files
        self._quiet = quiet  # auto: its work begins once the worker is quiet (`Quiet.wait`)
        self.folder = folder
        self.n_ctx = n_ctx
        self.threads = threads
        self.forced = forced
        self.merge = merge  # a job's merged copy is made once its adapter serves (`begin_merge`)
        self.state = "making"
        self.engine: Engine | None = None
        self._lock = threading.Lock()
        self._adapters: dict[tuple[str, str], Path | None] = {}  # (folder, fingerprint) → its file (None: making)
        self._failed: set[tuple[str, str]] = set()
        # merged copies: the one answering (`merged`), one loaded and not yet answering (installed by the next
        # request: only the request thread uses engines), the one being made
        self._merged: tuple[tuple[str, str], Engine] | None = None
        self._merged_ready: tuple[tuple[str, str], Engine] | None = None
        self._merging: tuple[str, str] | None = None
        self._merge_failed: set[tuple[str, str]] = set()
        self.load_seconds = 0.0  # making (or finding) the file and loading it
        self._closed = threading.Event()
        self._run(lambda: self._load(threads))

    def _run(self, work: Callable[[], None], always: Callable[[], None] = lambda: None) -> None:
        """`work` now (llama.cpp forced), or in a thread once the worker is quiet (auto); then `always`."""
        if self.forced:
            try:
                work()
            finally:
                always()
            return

        def later() -> None:
            try:
                if self._quiet is not None:
                    self._quiet.wait(stop=self._closed)
                if not self._closed.is_set():  # the model was put away meanwhile: nothing to make
                    work()
            finally:
                always()

        threading.Thread(target=later, name="llama.cpp-files", daemon=True).start()

    def _load(self, threads: int) -> None:
        started = time.monotonic()
        try:
            engine = Engine(self.files.model(self.folder), self.n_ctx, threads)
        except Exception as exc:
            log.warning("llama.cpp will not serve %s: %s", self.folder, exc)
            with self._lock:
                self.state = "failed"
            if self.forced:
                raise UserFacing(f"llama.cpp could not load {self.folder}: {exc}", 503, "inference_unavailable") \
                    from None
            return
        with self._lock:
            if self._closed.is_set():  # the model was put away while its copy was made
                engine.close()
                return
            self.engine = engine
            self.state = "serving" if self.forced else "loaded"
            self.load_seconds = time.monotonic() - started

    def decide(self, llama_s: float, torch_s: float) -> bool:
        with self._lock:
            self.state = "serving" if llama_s < torch_s else "slower"
        log.info("chat engine for %s: %s (one token: llama.cpp %.2f ms, PyTorch %.2f ms)", self.folder,
                 "llama.cpp" if self.state == "serving" else "PyTorch", llama_s * 1000, torch_s * 1000)
        return self.state == "serving"

    def adapter(self, name: str, folder: str, stamp: str, base: str) -> str:
        """Whether the engine holds the adapter in `folder` under `name` now: "held" (as before this request),
        "added" (by it), or "" (not: its file is being made, in a thread for auto, or the converter or llama.cpp
        refused it; PyTorch answers)."""
        assert self.engine is not None
        key = (folder, stamp)
        if self.engine.has_adapter(name, key):
            return "held"
        with self._lock:
            if key in self._failed:
                if self.forced:
                    raise UserFacing(f"llama.cpp could not serve the adapter in {folder} (the worker's log says why)",
                                     503, "inference_unavailable")
                return ""
            start = key not in self._adapters
            if start:
                self._adapters[key] = None
        if start:
            self._run(lambda: self._make_adapter(key, base))
        with self._lock:
            path = self._adapters.get(key)
        if path is None:
            return ""
        try:
            self.engine.add_adapter(name, path, key)
        except UserFacing:
            if self.forced:
                raise
            log.warning("llama.cpp will not serve the adapter in %s: it refused %s", folder, path)
            with self._lock:
                self._failed.add(key)
            return ""
        return "added"

    def _make_adapter(self, key: tuple[str, str], base: str) -> None:
        try:
            path = self.files.adapter(key[0], base)
        except Exception as exc:  # the converter's refusal (UserError) or anything else: PyTorch answers the job
            log.warning("llama.cpp will not serve the adapter in %s: %s", key[0], exc)
            with self._lock:
                self._failed.add(key)
                self._adapters.pop(key, None)
            if self.forced:
                raise UserFacing(f"llama.cpp could not convert the adapter in {key[0]}: {exc}", 503,
                                 "inference_unavailable") from None
            return
        with self._lock:
            self._adapters[key] = path

    def merged(self, folder: str, stamp: str) -> tuple[Engine | None, bool]:
        """The engine of the merged copy of the adapter in `folder` (None: there is none loaded), and whether this
        call put it in place: a copy loaded since is put in place, the one it replaces closed, at the first request
        for its own job (only the request thread uses engines)."""
        key = (folder, stamp)
        with self._lock:
            new = self._merged_ready is not None and self._merged_ready[0] == key
            old = self._merged if new else None
            if new:
                self._merged, self._merged_ready = self._merged_ready, None
            current = self._merged
        if old is not None:
            old[1].close()
        if current is None or current[0] != key:
            return None, False
        return current[1], new

    def begin_merge(self, folder: str, stamp: str, base: str) -> None:
        """Begin making and loading the merged copy of the adapter in `folder` (its base `base`), in a thread once
        the worker is quiet: where this side merges, none is being made, and the adapter has none loaded."""
        key = (folder, stamp)
        with self._lock:
            if (not self.merge or self._merging is not None or key in self._merge_failed
                    or any(made is not None and made[0] == key for made in (self._merged, self._merged_ready))):
                return
            self._merging = key
        self._run(lambda: self._make_merged(key, base), always=lambda: self._merge_ended(key))

    def _make_merged(self, key: tuple[str, str], base: str) -> None:
        try:
            with MERGING:  # the file stays until the engine has it open
                engine = Engine(self.files.merged(key[0], base, self._closed), self.n_ctx, self.threads)
        except Stopped:
            return
        except Exception as exc:  # the converter's refusal, or llama.cpp's: the adapter on the base answers
            log.warning("llama.cpp will not serve a merged copy of %s: %s", key[0], exc)
            with self._lock:
                self._merge_failed.add(key)
            return
        with self._lock:
            if self._closed.is_set():
                dropped: tuple[tuple[str, str], Engine] | None = (key, engine)
            else:
                dropped, self._merged_ready = self._merged_ready, (key, engine)
        if dropped is not None:  # never answered: no request holds it
            dropped[1].close()

    def _merge_ended(self, key: tuple[str, str]) -> None:
        with self._lock:
            if self._merging == key:
                self._merging = None

    def close(self) -> None:
        with self._lock:
            self._closed.set()
            engine, self.engine = self.engine, None
            merged = [m[1] for m in (self._merged, self._merged_ready) if m is not None]
            self._merged = self._merged_ready = None
        for held in [engine, *merged]:
            if held is not None:
                held.close()
