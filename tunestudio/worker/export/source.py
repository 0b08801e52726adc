"""What an export reads, and what each of its steps is handed.

`Source` is what the finished job left (`find_source`: adapter or full model,
the base an adapter belongs to, the job's own config, and whether it is a
vision-language model: an image job's, `is_dataset_image`). `ExportStep` is what a
step (merge, GGUF conversion, hub upload) works with: the channel it reports
on, the stop check it calls between pieces of work (raising `Cancelled`), and
the part of the export's one 0–100 progress scale it fills.

job.py (the recipe) and its steps, model.py, gguf.py and hub.py, all import
this module; none of them imports another's recipe.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunestudio.export_config import ExportConfig
from tunestudio.paths import expand
from tunestudio.worker.channel import Channel
from tunestudio.worker.errors import UserError

__all__ = ["Cancelled", "ExportStep", "Source", "find_source"]


class Cancelled(Exception):
    """The parent asked the export to stop; nothing is kept."""


@dataclass(frozen=True)
class Source:
    """What a finished job left: the folder to read, and the base model an adapter belongs to."""

    path: Path
    adapter: bool
    base_model: str | None
    job_config: dict[str, Any]
    vision: bool = False  # a vision-language model (AutoModelForImageTextToText and its processor)
    reward: bool = False  # a reward model: a one-output score head (AutoModelForSequenceClassification)
    speech: bool = False  # a speech-to-text model (AutoModelForSpeechSeq2Seq and its processor)


def find_source(cfg: ExportConfig) -> Source:
    """The folder the export reads (the job's output, or one of its checkpoints) and what it holds;
    UserError when there is nothing to export there."""
    root = expand(cfg.source_dir)
    if not root.is_dir():
        raise UserError(f"source_dir {cfg.source_dir}: no such folder (has the job finished and saved?)")
    path = root
    if cfg.checkpoint:
        inside = root / cfg.checkpoint
        path = inside if inside.is_dir() else expand(cfg.checkpoint)
        if not path.is_dir():
            raise UserError(f"checkpoint {cfg.checkpoint}: no such folder in {root} or on disk")
    job_config: dict[str, Any] = {}
    if (root / "job_config.json").is_file():
        job_config = json.loads((root / "job_config.json").read_text(encoding="utf-8"))
    if (path / "adapter_config.json").is_file():
        adapter_config = json.loads((path / "adapter_config.json").read_text(encoding="utf-8"))
        base = job_config.get("model_name") or adapter_config.get("base_model_name_or_path")
        if not base:
            raise UserError(f"{path}: the adapter does not say which base model it belongs to")
        base_config = _saved(expand(base) / "config.json")
        return Source(path, True, base, job_config, _is_vision(job_config, base_config),
                      _is_reward(job_config, adapter_config), _is_speech(job_config, base_config))
    if (path / "config.json").is_file():
        model_config = _saved(path / "config.json")
        return Source(path, False, None, job_config, _is_vision(job_config, model_config),
                      _is_reward(job_config, model_config), _is_speech(job_config, model_config))
    raise UserError(f"{path}: neither an adapter (adapter_config.json) nor a model (config.json) to export")


def _saved(config_file: Path) -> dict[str, Any]:
    """A config file's fields ({} when it cannot be read: the job's own record then decides, or nothing is known)."""
    try:
        saved = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) else {}


def _is_reward(job_config: dict[str, Any], saved: dict[str, Any]) -> bool:
    """A reward job's model (method reward), else, for a folder without a job, a sequence classifier (its config's
    architecture) or an adapter of one (peft's SEQ_CLS task)."""
    if "method" in job_config:
        return job_config["method"] == "reward"
    return saved.get("task_type") == "SEQ_CLS" or any(
        str(a).endswith("ForSequenceClassification") for a in saved.get("architectures") or [])


def _is_speech(job_config: dict[str, Any], model_config: dict[str, Any]) -> bool:
    """An audio job's model (the job says so), else, for a folder without a job, a speech encoder-decoder (mel
    bins in its config)."""
    if "is_dataset_audio" in job_config:
        return bool(job_config["is_dataset_audio"])
    return bool(model_config.get("is_encoder_decoder")) and "num_mel_bins" in model_config


def _is_vision(job_config: dict[str, Any], model_config: dict[str, Any]) -> bool:
    """An image job's model (the job says so), else, for a folder without a job, a model with a vision config."""
    if "is_dataset_image" in job_config:
        return bool(job_config["is_dataset_image"])
    return "vision_config" in model_config


@dataclass(frozen=True)
class ExportStep:
    """One step of an export: the channel it reports on, its stop check (raises `Cancelled` once the parent
    asked to stop), and the part `progress` = (start, end) of the export's 0–100 scale it fills."""

    channel: Channel
    check_stop: Callable[[], None]
    progress: tuple[int, int] = (0, 100)

    @classmethod
    def of(cls, channel: Channel) -> ExportStep:
        """The whole export: its stop check reads the channel's latest stop command."""

        def check_stop() -> None:
            if channel.stop_request is not None:
                raise Cancelled

        return cls(channel, check_stop)

    def within(self, start: int, end: int) -> ExportStep:
        """The same step, filling start–end of the 0–100 scale."""
        return dataclasses.replace(self, progress=(start, end))

    def report(self, fraction: float) -> None:
        """One Progress event on the export's 0–100 scale, `fraction` of the way through this step."""
        start, end = self.progress
        self.channel.progress(step=int(start + (end - start) * fraction), total_steps=100)
