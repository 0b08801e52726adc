"""GGUF exports through llama.cpp's own converters, and an Ollama Modelfile beside the file.

A vision-language model becomes two files, as llama.cpp serves it (`llama-mtmd-cli -m MODEL --mmproj
PROJECTOR`): the text model, and its vision tower and projector (`convert_hf_to_gguf.py --mmproj`), written
first because it is the smaller one and a converter that fails on it should fail early. Whether the converter
knows both halves is asked before anything is merged (`require_convertible`).

The converters run in a child process through `tunestudio.worker.converter` (which the chat worker's llama.cpp
copies use too); that child (and llama-quantize) dies with this worker.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from tunestudio.paths import expand
from tunestudio.worker.channel import Channel
from tunestudio.worker.converter import LLAMA_CPP_VERSION, driver, driver_env, run_child
from tunestudio.worker.errors import UserError
from tunestudio.worker.export.modelfile import write_modelfile
from tunestudio.worker.export.source import ExportStep, Source


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
    _run_child([*driver("check", None), str(config_dir)], driver_env(), step.channel, step.check_stop, None, found)
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
    _run_child([*driver(which, model_dir), *args], driver_env(), step.channel, step.check_stop, step.progress)


def _run_child(command: list[str], env: dict[str, str], channel: Channel, check_stop: Callable[[], None],
               progress: tuple[int, int] | None, found: list[dict] | None = None) -> None:
    """`converter.run_child` for an export: warnings to the job's channel, progress into `progress` of the 0–100
    scale (none if None)."""
    step = ExportStep(channel, check_stop, progress) if progress is not None else None
    run_child(command, env, channel.warn, check_stop, step.report if step is not None else None, found)
