"""Runs one of llama.cpp's converters in a child process, with two additions.

`python -m tunestudio.worker.export.gguf_driver hf|lora ARGS...` runs
`convert_hf_to_gguf.py` or `convert_lora_to_gguf.py` (from the llama.cpp
source that `make setup` fetches) with ARGS, as its own command line would.
`... merged ADAPTER BASE SCRATCH ARGS...` first folds a LoRA adapter into its
base (peft's `merge_and_unload`, fp32, as the export merges a job before its
GGUF) and saves that model with its tokenizer in SCRATCH (a new folder, removed
at the end), then converts SCRATCH as `hf` would: chat's merged copy of a job
for llama.cpp (serve/llamacpp.py).
`... check MODEL_DIR` asks the converter, without converting, which of its
model classes a vision-language model's text half and projector would use
(`{"check": {...}}`: the export refuses one it cannot convert before merging).

It runs in its own interpreter with llama.cpp's bundled `gguf-py` first on
sys.path: the converter needs that copy (the PyPI `gguf` of the same version
number fails inside it), while the rest of tunestudio and transformers' GGUF
reader use the PyPI one. Nothing from tunestudio is imported here beyond this
module, so the two copies never meet in one process (the merge imports
transformers and peft before the bundled copy is put on the path).

The additions, reported as JSON lines on stdout (the converter logs to stderr):
- progress: the converter writes tensors through a tqdm bar over bytes; a tqdm
  that reports `{"progress": done, "total": total}` stands in for it.
- a tokenizer the converter does not know: llama.cpp recognises BPE
  pre-tokenizers by a hash of their output and refuses unknown ones. With
  `--pre-tokenizer-fallback=MODEL_DIR`, an unknown one is named after what its
  tokenizer.json says (byte-level with the GPT-2 split → "gpt-2", else
  "default") and `{"warning": ...}` says so.
- a SmolVLM/Idefics3 text half whose config does not name its architecture:
  the converter routes a VLM's text half by `text_config.architectures`, which
  the published SmolVLM configs carry (VLlama3ForCausalLM) and a config built
  with transformers' SmolVLMConfig does not; such a Llama text half is routed
  as the published ones are (`text_architecture`).
"""

from __future__ import annotations

import json
import os
import runpy
import shutil
import sys
import time
from pathlib import Path
from typing import Any

FALLBACK_FLAG = "--pre-tokenizer-fallback"
REPORT_EVERY_S = 0.2
# VLM wrappers whose Llama text half llama.cpp converts as VLlama3ForCausalLM (conversion/llama.py).
LLAMA_TEXT_HALF = ("SmolVLMForConditionalGeneration", "Idefics3ForConditionalGeneration")


def report(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def pre_tokenizer_name(model_dir: Path) -> str:
    """The llama.cpp pre-tokenizer closest to what the model's tokenizer.json declares."""
    try:
        spec = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8")).get("pre_tokenizer") or {}
    except (OSError, ValueError):
        return "default"
    parts = spec.get("pretokenizers", [spec]) if spec.get("type") == "Sequence" else [spec]
    if len(parts) == 1 and parts[0].get("type") == "ByteLevel" and parts[0].get("use_regex", True):
        return "gpt-2"  # ByteLevel with its regex is exactly GPT-2's split
    return "default"


def text_architecture(architecture: str, hparams: dict[str, Any]) -> str:
    """The class the converter should use for a model's text half: `architecture` (what llama.cpp found), or
    VLlama3ForCausalLM for a SmolVLM/Idefics3 whose text_config names no architecture and is a Llama."""
    text_config = hparams.get("text_config") or {}
    if (architecture in LLAMA_TEXT_HALF and not text_config.get("architectures")
            and text_config.get("model_type") == "llama"):
        return "VLlama3ForCausalLM"
    return architecture


def _patch_text_architecture() -> None:
    import conversion

    original = conversion.get_model_architecture

    def get_model_architecture(hparams: dict[str, Any], model_type: Any) -> str:
        found = original(hparams, model_type)
        return text_architecture(found, hparams) if model_type == conversion.ModelType.TEXT else found

    conversion.get_model_architecture = get_model_architecture  # convert_hf_to_gguf.py imports it from here


def check(model_dir: Path) -> dict[str, Any]:
    """What the converter would make of a vision-language model: the class of its text half and of its projector
    (None where it has no vision config), and whether the converter knows each."""
    import conversion

    hparams = conversion.ModelBase.load_hparams(model_dir, False)
    text = conversion.get_model_architecture(hparams, conversion.ModelType.TEXT)
    mmproj = (conversion.get_model_architecture(hparams, conversion.ModelType.MMPROJ)
              if hparams.get("vision_config") else None)
    return {"text": text, "text_supported": text in conversion.TEXT_MODEL_MAP, "mmproj": mmproj,
            "mmproj_supported": mmproj in conversion.MMPROJ_MODEL_MAP}


def _patch_pre_tokenizer(model_dir: Path) -> None:
    from conversion.base import TextModel

    original = TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self: Any, tokenizer: Any) -> str:
        try:
            return original(self, tokenizer)
        except NotImplementedError:
            name = pre_tokenizer_name(model_dir)
            report(warning=(
                f"llama.cpp's converter does not know this tokenizer's pre-tokenizer; it is written as {name!r} "
                "(from tokenizer.json). Check that llama.cpp tokenizes text the same way before relying on it."
            ))
            return name

    TextModel.get_vocab_base_pre = get_vocab_base_pre


def _patch_progress() -> None:
    import tqdm

    class ReportingBar(tqdm.tqdm):
        """A silent bar that reports its position as JSON lines, at most every REPORT_EVERY_S."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = False
            kwargs["file"] = open(os.devnull, "w")  # noqa: SIM115 - closed with the bar
            super().__init__(*args, **kwargs)
            self._last = 0.0

        def update(self, n: float | None = 1) -> bool | None:
            out = super().update(n)
            now = time.monotonic()
            if self.total and (now - self._last >= REPORT_EVERY_S or self.n >= self.total):
                self._last = now
                report(progress=int(self.n), total=int(self.total))
            return out

        def close(self) -> None:
            fp = self.fp
            super().close()
            fp.close()

    tqdm.tqdm = ReportingBar


def merge(adapter: Path, base: Path, scratch: Path) -> None:
    """`adapter` folded into `base` in fp32 and saved in `scratch` with the tokenizer (the adapter's folder's where
    the job saved one, else the base's), as export/model.py's `write_merged` does for a job's GGUF export."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32, local_files_only=True)
    model = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    model.config.use_cache = True
    model.save_pretrained(str(scratch), safe_serialization=True)
    tokenizer_dir = adapter if (adapter / "tokenizer_config.json").is_file() else base
    AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True).save_pretrained(str(scratch))


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("hf", "lora", "check", "merged"):
        print("usage: python -m tunestudio.worker.export.gguf_driver hf|lora [--pre-tokenizer-fallback=DIR] ARGS...\n"
              "       python -m tunestudio.worker.export.gguf_driver merged ADAPTER BASE SCRATCH ARGS...\n"
              "       python -m tunestudio.worker.export.gguf_driver check MODEL_DIR", file=sys.stderr)
        return 2
    which, args = argv[0], argv[1:]
    if which == "merged":
        adapter, base, scratch = (Path(a) for a in args[:3])
        scratch.mkdir()  # new: a folder left by a killed run is the caller's to remove
        try:
            merge(adapter, base, scratch)
            return main(["hf", f"{FALLBACK_FLAG}={scratch}", str(scratch), *args[3:]])
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    root = Path(os.environ["TUNESTUDIO_LLAMA_CPP"])
    # The bundled gguf-py before site-packages, and before the converter adds it itself.
    sys.path[:0] = [str(root / "gguf-py"), str(root)]
    fallback = [a.split("=", 1)[1] for a in args if a.startswith(FALLBACK_FLAG + "=")]
    args = [a for a in args if not a.startswith(FALLBACK_FLAG + "=")]
    _patch_text_architecture()
    if which == "check":
        report(check=check(Path(args[0])))
        return 0
    _patch_progress()
    if which == "hf" and fallback:
        _patch_pre_tokenizer(Path(fallback[0]))
    # Run the script as its own command line would (convert_lora_to_gguf.py has no main()).
    script = root / ("convert_hf_to_gguf.py" if which == "hf" else "convert_lora_to_gguf.py")
    sys.argv = [str(script), *args]
    runpy.run_path(str(script), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
