"""One export's life inside the worker process, top to bottom.

validate → find what the job left (adapter or full model, its base) →
check the tools the target needs → load and merge → write the target into a
staging folder → move it into place → report.

Everything is written into a hidden staging folder beside the output folder
(`ownership.stage`) and renamed into place only when complete, so an export
that is cancelled, fails or is killed never leaves a half-written file where
the result would be. An earlier export in the folder is replaced file by file:
what its export.json lists goes, anything the user put there since stays.

Progress is one 0–100 scale for the whole export; phases reuse the job
statuses (`loading_model` while weights load and merge, `saving` while the
target is written or uploaded).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tunestudio import ownership
from tunestudio.config import format_validation_error
from tunestudio.export_config import ExportConfig
from tunestudio.paths import expand
from tunestudio.worker.channel import Channel, quiet_libraries
from tunestudio.worker.errors import UserError
from tunestudio.worker.export.source import Cancelled, ExportStep, Source, find_source

__all__ = ["MARKER", "find_source", "run", "staging_dir"]

MARKER = "export.json"  # written into every export folder; an existing folder is replaced only if it has one


def run(config: ExportConfig | dict[str, Any], channel: Channel, secrets: dict[str, str] | None = None,
        cache_dir: str | None = None) -> int:
    """Run one export to its end; returns the process exit code (0 completed or cancelled, 1 failed).

    cache_dir: unused (every recipe of tunestudio.kinds is called the same way)."""
    cfg: ExportConfig | None = None
    try:
        cfg = _validate(config, secrets)
        quiet_libraries()
        return _export(cfg, channel)
    except Cancelled:
        channel.completed(output_dir=None, stopped=True, saved=False)
        return 0
    except UserError as exc:
        channel.failed(_scrub(str(exc), cfg), _scrub(traceback.format_exc(), cfg))
    except Exception as exc:
        channel.failed(_scrub(f"{type(exc).__name__}: {exc}", cfg), _scrub(traceback.format_exc(), cfg))
    return 1


def _validate(config: ExportConfig | dict[str, Any], secrets: dict[str, str] | None) -> ExportConfig:
    if isinstance(config, ExportConfig):
        return config
    try:
        return ExportConfig.from_parts(config, secrets)
    except ValidationError as exc:
        fields = "; ".join(f"{e['field']}: {e['message']}" for e in format_validation_error(exc))
        raise UserError(f"invalid export config: {fields}") from None


def _scrub(text: str, cfg: ExportConfig | None) -> str:
    """The token never leaves the worker, even inside a library's error message."""
    token = cfg.hf_token.get_secret_value() if cfg is not None and cfg.hf_token is not None else None
    return text.replace(token, "***") if token else text


def _export(cfg: ExportConfig, channel: Channel) -> int:
    from tunestudio.worker.export import gguf as export_gguf
    from tunestudio.worker.export import hub as export_hub
    from tunestudio.worker.export import model as export_model

    source = find_source(cfg)
    output = expand(cfg.resolved_output_dir())
    kind = ("image model's " if source.vision else "reward model's " if source.reward else
            "speech model's " if source.speech else "") + (
        "adapter" if source.adapter else "full model")
    channel.log(f"exporting the {kind} in {source.path} as {cfg.target} to {output}")

    _check_target(cfg, source, channel)
    staging = _prepare_staging(output)
    step = ExportStep.of(channel)
    try:
        if cfg.target == "merged":
            channel.phase("loading_model", f"merging the adapter into {source.base_model}" if source.adapter else "")
            export_model.write_merged(source, cfg.dtype, staging, step.within(0, 90))
        elif cfg.target == "gguf":
            hf_dir = source.path
            if source.adapter:  # the converter reads a plain HF folder: merge first (fp32, no loss before the cast)
                channel.phase("loading_model", f"merging the adapter into {source.base_model}")
                hf_dir = staging / ".merged"
                export_model.write_merged(source, "fp32", hf_dir, step.within(0, 30))
            channel.phase("saving", f"converting to GGUF {cfg.resolved_quantization}")
            export_gguf.write_gguf(hf_dir, staging, cfg.resolved_quantization or "f16", step.within(30, 98),
                                   vision=source.vision)
            if hf_dir != source.path:
                shutil.rmtree(hf_dir)
        elif cfg.target == "gguf-lora":
            channel.phase("saving", f"converting the adapter to a GGUF LoRA ({cfg.resolved_quantization})")
            export_gguf.write_gguf_lora(source, staging, cfg.resolved_quantization or "f16", step.within(0, 98))
        else:
            export_hub.push(source, cfg, staging, step)
        step.check_stop()
        _write_marker(cfg, source, staging)
        _move_into_place(staging, output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    channel.progress(step=100, total_steps=100)
    channel.log(f"export written to {output}: {', '.join(sorted(_earlier_files(output)))}")
    channel.completed(output_dir=str(output), saved=True)
    return 0


def _check_target(cfg: ExportConfig, source: Source, channel: Channel) -> None:
    """What the target needs, checked before anything loads: a missing tool should cost seconds, not minutes."""
    from tunestudio.worker.converter import require_converter
    from tunestudio.worker.export import gguf as export_gguf
    from tunestudio.worker.export import hub as export_hub

    if cfg.target in ("gguf", "gguf-lora") and source.reward:
        raise UserError("a reward model scores text with a one-output head, which llama.cpp's chat GGUF has no "
                        "place for; export it as merged (AutoModelForSequenceClassification loads it) or to the hub")
    if cfg.target in ("gguf", "gguf-lora") and source.speech:
        raise UserError("a speech-to-text model (Whisper's encoder-decoder) has no place in llama.cpp's chat GGUF "
                        "(whisper.cpp has its own format); export it as merged (WhisperForConditionalGeneration "
                        "loads it) or to the hub")
    if cfg.target in ("gguf", "gguf-lora"):
        require_converter()
    if cfg.resolved_quantization == "q4_k_m":
        export_gguf.require_quantize()
    if cfg.target == "gguf-lora" and not source.adapter:
        raise UserError("gguf-lora exports an adapter, and this job is a full fine-tune; export it as gguf")
    if cfg.target == "gguf-lora" and source.vision:
        # llama.cpp's LoRA converter keeps the text model's tensors and drops the vision tower's without a word.
        raise UserError("gguf-lora carries a LoRA for llama.cpp's text model only, and this image job's adapter "
                        "may change its vision tower and projector too; export it as gguf (the merged model and "
                        "its mmproj projector) or merged")
    if cfg.target == "gguf" and source.vision:
        with _config_dir(source) as config_dir:
            export_gguf.require_convertible(config_dir, ExportStep.of(channel))
    if cfg.target == "hub":
        export_hub.require_hub(cfg)


@contextlib.contextmanager
def _config_dir(source: Source) -> Iterator[Path]:
    """A folder holding the config.json of the model the export converts (the base of an adapter), for the
    converter's check; a hub model's config is read from the cache (or the hub) into a temporary folder."""
    local = source.path if not source.adapter else expand(source.base_model or "")
    if (local / "config.json").is_file():
        yield local
        return
    from transformers import AutoConfig

    from tunestudio.worker.train import from_pretrained

    with tempfile.TemporaryDirectory(prefix="tunestudio-config-") as folder:
        from_pretrained(AutoConfig, source.base_model or "", "config").save_pretrained(folder)
        yield Path(folder)


def staging_dir(output: Path) -> Path:
    return ownership.staging(output)


def _prepare_staging(output: Path) -> Path:
    held = [p for p in output.iterdir() if p.name != ownership.MARKER] if output.is_dir() else []
    if output.exists() and (not output.is_dir() or (held and not (output / MARKER).is_file())):
        raise UserError(f"output_dir {output} exists and is not an earlier export; choose another folder")
    try:
        return ownership.stage(output)  # a staging folder a killed export left is removed first, only that
    except ownership.NotOurs as exc:
        raise UserError(f"output_dir: {exc}") from None


def _write_marker(cfg: ExportConfig, source: Source, staging: Path) -> None:
    record = {
        "export": cfg.public_dict(),
        "source": str(source.path),
        "base_model": source.base_model,
        "files": sorted(p.name for p in staging.iterdir() if p.name != ownership.PARTIAL),
    }
    (staging / MARKER).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def _earlier_files(output: Path) -> set[str]:
    """What the export in `output` wrote: its export.json and the plain names that lists (none without one)."""
    try:
        record = json.loads((output / MARKER).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return set()
    except (OSError, ValueError):
        return {MARKER}
    listed = record.get("files") if isinstance(record, dict) else None
    names = {name for name in listed if isinstance(name, str)} if isinstance(listed, list) else set()
    return {MARKER} | {name for name in names
                       if name == Path(name).name and name not in ("", ".", "..", ownership.MARKER)}


def _exists(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def _move_into_place(staging: Path, output: Path) -> None:
    """Move the finished files from staging into the output folder, replacing an earlier export there: the files
    its export.json lists go, nothing else. A file the user put in the folder since stays, and one the new export
    would overwrite is refused (UserError) before anything moves."""
    earlier = _earlier_files(output)
    new = sorted((p for p in staging.iterdir() if p.name != ownership.PARTIAL), key=lambda p: p.name == MARKER)
    clash = [p.name for p in new if p.name not in earlier and _exists(output / p.name)]
    if clash:
        raise UserError(f"output_dir {output} holds {', '.join(clash)}, which the earlier export there did not "
                        "write; move it away or export into another folder")
    output.mkdir(parents=True, exist_ok=True)
    ownership.replaced(output, earlier)  # the job's seal then records the new files as its own
    old = staging / ".replaced"
    old.mkdir()
    for name in sorted(earlier, key=lambda name: name != MARKER):  # the folder stops saying it holds an export
        if _exists(output / name):
            (output / name).rename(old / name)
    for path in new:  # export.json last: the folder says it holds an export once the export is whole
        path.rename(output / path.name)
    shutil.rmtree(staging)
