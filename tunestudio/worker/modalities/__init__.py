"""Kinds of data: one object per modality, which the worker's recipes ask instead of branching on the data.

A job's modality (`JobConfig.modality`: text, image, audio; tool calls and reasoning are properties of chat data,
not modalities) decides how its processor and model are loaded, how its dataset is read, checked and split,
how a prompt is answered (the before/after samples), how held-out rows are scored, and which classes the chat
worker loads a finished job with. Text is the first implementation (`text.py`); a new kind of data is a new
module here and one entry in MODALITIES, and `config/vocabulary.py`'s MODALITIES names it for the parent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from tunestudio.worker.modalities.audio import AudioModality
from tunestudio.worker.modalities.image import ImageModality
from tunestudio.worker.modalities.text import TextModality
from tunestudio.worker.modalities.vision_compat import allow_missing_video, torchvision_available

if TYPE_CHECKING:
    from collections.abc import Sequence

    import torch

    from tunestudio.config import JobConfig
    from tunestudio.worker.data import PreparedData
    from tunestudio.worker.train import Evaluator

__all__ = ["MODALITIES", "Modality", "allow_missing_video", "detected", "for_job", "named", "torchvision_available"]


class Modality(Protocol):
    """What the recipes and the chat worker ask of a kind of data."""

    name: str

    def load_processor(self, cfg: JobConfig) -> Any:
        """The processing class the trainer takes (a tokenizer for text, a processor for images and audio)."""

    def load_model(self, cfg: JobConfig, compute_dtype: torch.dtype) -> torch.nn.Module:
        """The base model, for training (before adapters)."""

    def prepare_data(self, cfg: JobConfig, processor: Any, progress: Any = None) -> PreparedData:
        """The job's rows read, checked (file and row named), converted for the trainer and split; progress(done,
        total), where a kind of data has slow rows to say it of (images opened and measured)."""

    def generate(self, model: torch.nn.Module, processor: Any, prompt: str) -> str:
        """One greedy answer to a sample prompt (the job's before/after samples)."""

    def evaluator(self, held_eval: Any, limit: int, places: Sequence[dict[str, Any]] | None,
                  max_length: int) -> Evaluator | None:
        """What scores the held-out rows before and after training (None: nothing held out)."""

    def serving_loaders(self) -> tuple[Any, Any]:
        """(processor class, model class) the chat worker loads a finished job's folder with."""


MODALITIES: dict[str, Modality] = {m.name: m for m in (TextModality(), ImageModality(), AudioModality())}


def named(name: str) -> Modality:
    """The modality of that name; a UserError-worthy KeyError for one with no implementation in this worker."""
    try:
        return MODALITIES[name]
    except KeyError:
        raise KeyError(f"{name} data has no implementation in this worker (there are: {', '.join(MODALITIES)})") \
            from None


def for_job(cfg: JobConfig) -> Modality:
    return named(cfg.modality)


def detected(cfg: JobConfig) -> tuple[JobConfig, str | None]:
    """The job with its kind of data read from the data when its flags leave it at text (is_dataset_image is
    detected like the text formats: from the first rows), and the note saying so; a method that trains text only
    keeps text (its own checks then name the rows)."""
    from tunestudio.config import METHOD_SPECS

    if cfg.modality != "text" or "image" not in METHOD_SPECS[cfg.method].modalities:
        return cfg, None
    from itertools import islice

    from tunestudio.worker.data import is_image_row, open_rows, read_head

    try:
        if cfg.local_datasets:
            head, _, _ = read_head(cfg.local_datasets, cfg.train_split, 20, 1 << 20)
        else:  # a hub dataset (an `Image` feature): its first rows, as the data step will read them
            head = list(islice(open_rows(cfg).train, 20))
    except Exception:  # unreadable data is the data step's to report, with its row
        return cfg, None
    if not any(is_image_row(r.data) for r in head):
        return cfg, None
    return (cfg.model_copy(update={"is_dataset_image": True}),
            "dataset: its rows hold images, so the job trains as an image job (is_dataset_image auto-detected)")
