"""GGUF exports through llama.cpp's own converters, and an Ollama Modelfile beside the file.

A vision-language model becomes two files, as llama.cpp serves it (`llama-mtmd-cli -m MODEL --mmproj
PROJECTOR`): the text model, and its vision tower and projector (`convert_hf_to_gguf.py --mmproj`), written
first because it is the smaller one and a converter that fails on it should fail early. Whether the converter
knows both halves is asked before anything is merged (`require_convertible`).

The converters come from the `llama-cpp-python` source distribution that
`make setup` fetches (third_party/llama.cpp, or $TUNESTUDIO_LLAMA_CPP). They
run as a child process (`tunestudio.worker.export.gguf_driver`) with llama.cpp's
bundled gguf-py on their path; this process keeps the PyPI one. That child
(and llama-quantize) dies with this worker (PR_SET_PDEATHSIG): a worker killed
with its server takes its converter along.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path

from tunestudio.paths import expand
from tunestudio.worker.channel import Channel
from tunestudio.worker.errors import UserError
from tunestudio.worker.export.modelfile import write_modelfile
from tunestudio.worker.export.source import ExportStep, Source

LLAMA_CPP_VERSION = "0.3.36"  # the llama-cpp-python release pinned in the Makefile
POLL_S = 0.1
KILL_GRACE_S = 5.0
PR_SET_PDEATHSIG = 1
DRIVER = "tunestudio.worker.export.gguf_driver"


def llama_cpp_dir() -> Path:
    configured = os.environ.get("TUNESTUDIO_LLAMA_CPP")
    if configured:
        return expand(configured)
    return Path(__file__).resolve().parents[3] / "third_party" / "llama.cpp"


def require_converter() -> Path:
    root = llama_cpp_dir()
    if not (root / "convert_hf_to_gguf.py").is_file() or not (root / "gguf-py" / "gguf").is_dir():
        raise UserError(
            f"llama.cpp's GGUF converter is not at {root}. Run `make setup` (it fetches llama-cpp-python "
            f"{LLAMA_CPP_VERSION}'s source into third_party/llama.cpp), or set TUNESTUDIO_LLAMA_CPP to a llama.cpp "
            "checkout that has convert_hf_to_gguf.py and gguf-py."
        )
    return root


def require_quantize() -> str:
    found = shutil.which("llama-quantize")
    if found is None:
        raise UserError(
            "quantization q4_k_m needs llama.cpp's `llama-quantize` program on PATH, and it is not there. "
            "Install llama.cpp (a release from https://github.com/ggml-org/llama.cpp/releases, `brew install "
            "llama.cpp`, or build it: cmake -B build && cmake --build build --target llama-quantize) and put its "
            "bin folder on PATH; or export f16, bf16 or q8_0, which need no binary."
        )
    return found


def require_convertible(config_dir: Path, step: ExportStep) -> None:
    """UserError unless llama.cpp's converter knows both halves of the vision-language model whose config.json is
    in `config_dir` (its text model and its vision projector); nothing is loaded or written."""
    found: list[dict] = []
    _run_child([*_driver("check", None), str(config_dir)], _driver_env(), step.channel, step.check_stop, None, found)
    answer = next((m["check"] for m in found if isinstance(m.get("check"), dict)), None)
    if answer is None:
        raise UserError("the GGUF converter did not say whether it can convert this model")
    missing = []
    if not answer["text_supported"]:
        missing.append(f"its text model ({answer['text']})")
    if not answer["mmproj_supported"]:
        missing.append(f"its vision projector ({answer['mmproj'] or 'the config has no vision_config'})")
    if missing:
        raise UserError(
            f"llama.cpp's converter (llama-cpp-python {LLAMA_CPP_VERSION}) cannot convert {' nor '.join(missing)} "
            "to GGUF, so this image model has no GGUF export here; export it as merged (transformers loads it) "
            "instead.")


def projector_quantization(quantization: str) -> str:
    """The projector's type: the one asked for, except q4_k_m (llama-quantize is for text models): f16."""
    return "f16" if quantization == "q4_k_m" else quantization


def write_gguf(hf_dir: Path, staging: Path, quantization: str, step: ExportStep, vision: bool = False) -> Path:
    """`model-<quantization>.gguf` and its Modelfile in `staging` (and, for a vision-language model,
    `mmproj-<type>.gguf`, named in the Modelfile too); returns the text model GGUF's path."""
    name = f"model-{quantization}.gguf"
    projector = None
    if vision:
        projector = f"mmproj-{projector_quantization(quantization)}.gguf"
        start, end = step.progress
        split = start + (end - start) // 3
        _convert("hf", [str(hf_dir), "--mmproj", "--outtype", projector_quantization(quantization),
                        "--outfile", str(staging / projector)], None, step.within(start, split))
        step = step.within(split, end)
    start, end = step.progress
    if quantization == "q4_k_m":
        # The Python converter stops at q8_0; k-quants come from llama-quantize, from an f16 file.
        f16 = staging / ".model-f16.gguf"
        mid = start + (end - start) * 2 // 3
        _convert("hf", [str(hf_dir), "--outtype", "f16", "--outfile", str(f16)], hf_dir, step.within(start, mid))
        step.channel.log("quantizing to Q4_K_M with llama-quantize")
        _run_child([require_quantize(), str(f16), str(staging / name), "Q4_K_M"], {}, step.channel, step.check_stop,
                   None)
        f16.unlink()
    else:
        _convert("hf", [str(hf_dir), "--outtype", quantization, "--outfile", str(staging / name)], hf_dir, step)
    for warning in write_modelfile(hf_dir, staging / "Modelfile", name, projector):
        step.channel.warn(warning)
    return staging / name


def write_gguf_lora(source: Source, staging: Path, quantization: str, step: ExportStep) -> Path:
    """`adapter-<quantization>.gguf` in `staging`: the LoRA alone, for llama.cpp's --lora."""
    out = staging / f"adapter-{quantization}.gguf"
    args = ["--outtype", quantization, "--outfile", str(out)]
    base = expand(source.base_model or "")
    # The converter reads the base model's config (not its weights) from a folder, else from the hub.
    args += ["--base", str(base)] if base.is_dir() else ["--base-model-id", source.base_model or ""]
    _convert("lora", [*args, str(source.path)], None, step)
    return out


def _convert(which: str, args: list[str], model_dir: Path | None, step: ExportStep) -> None:
    _run_child([*_driver(which, model_dir), *args], _driver_env(), step.channel, step.check_stop, step.progress)


def _driver(which: str, model_dir: Path | None) -> list[str]:
    command = [sys.executable, "-m", DRIVER, which]
    if model_dir is not None:
        command.append(f"--pre-tokenizer-fallback={model_dir}")
    return command


def _driver_env() -> dict[str, str]:
    return {"TUNESTUDIO_LLAMA_CPP": str(require_converter())}


def _run_child(
    command: list[str],
    env: dict[str, str],
    channel: Channel,
    check_stop: Callable[[], None],
    progress: tuple[int, int] | None,
    found: list[dict] | None = None,
) -> None:
    """Run a converter or llama-quantize; its JSON lines become events (progress into `progress` of the
    0–100 scale, none if None), a stop request (`check_stop` raising) ends it; any other JSON line goes into
    `found`.

    stderr (the converter's own log) goes to this worker's stderr (the job's log
    file), and its last lines into the error if the child fails.
    """
    step = ExportStep(channel, check_stop, progress) if progress is not None else None
    full_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
    full_env.pop("HF_TOKEN", None)  # a converter has no use for a hub token
    tail: deque[str] = deque(maxlen=20)
    with subprocess.Popen(command, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          preexec_fn=_dies_with_this_process()) as proc:

        def pump_stdout() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                message = _parse(line)
                if message is None:
                    tail.append(line.rstrip())
                elif "warning" in message:
                    channel.warn(str(message["warning"]))
                elif "total" in message:
                    if step is not None and message["total"]:
                        step.report(int(message["progress"]) / int(message["total"]))
                elif found is not None:
                    found.append(message)

        def pump_stderr() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                tail.append(line.rstrip())
                sys.stderr.write(line)

        readers = [threading.Thread(target=f, daemon=True) for f in (pump_stdout, pump_stderr)]
        for reader in readers:
            reader.start()
        try:
            while proc.poll() is None:
                check_stop()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(POLL_S)
        except BaseException:
            proc.terminate()
            try:
                proc.wait(KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
        finally:
            for reader in readers:
                reader.join()
    if proc.returncode != 0:
        detail = "\n".join(line for line in tail if line)
        # the converter runs as `python -m tunestudio.worker.export.gguf_driver`: named, not as "python3"
        name = "the GGUF converter" if DRIVER in command else Path(command[0]).name
        raise UserError(f"{name} failed (exit code {proc.returncode}):\n{detail[-2000:]}")


def _dies_with_this_process() -> Callable[[], None] | None:
    """A preexec_fn: the child gets SIGKILL from the kernel when this process dies (PR_SET_PDEATHSIG), and exits
    at once if it already has. It runs between fork and exec, so it only calls prctl (libc loaded here, before the
    fork) and getppid. The thread that starts the child waits for it, so PDEATHSIG's firing when the starting
    *thread* ends changes nothing."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # this process died before prctl took hold
            os._exit(1)

    return preexec


def _parse(line: str) -> dict | None:
    if not line.startswith("{"):
        return None
    try:
        message = json.loads(line)
    except ValueError:
        return None
    return message if isinstance(message, dict) else None
