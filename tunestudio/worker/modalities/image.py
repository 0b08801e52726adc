"""Images: a vision-language model (`AutoModelForImageTextToText`, one code path for its families), its processor,
rows with images (worker/data/images.py), TRL's vision collator, and the before/after answers given the images.

The processor is set for a CPU unless the job asks otherwise: images at most `max_image_size` pixels on their
longest side (default: the vision tower's own input size) and never split into tiles (`image_splitting`), since
Idefics3/SmolVLM's splitting makes hundreds to a thousand tokens of each image. Which modules train follows the
seed's four switches (vision layers, language layers, attention, MLP): worker/train/vision_layers.py names them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tunestudio.config import JobConfig
from tunestudio.worker.errors import UserError

if TYPE_CHECKING:
    import torch

    from tunestudio.worker.data import PreparedData

def side(processor: Any, model_config: Any, cfg: JobConfig) -> int:
    """The longest side images are resized to: the job's max_image_size, else the vision tower's input size."""
    if cfg.max_image_size:
        return cfg.max_image_size
    vision = getattr(model_config, "vision_config", None)
    size = getattr(vision, "image_size", None)
    return int(size[0] if isinstance(size, (list, tuple)) else size) if size else 448


def _with(size: Any, **values: int) -> Any:
    """The processor's size record (a dict or transformers' SizeDict) with `values` set."""
    if isinstance(size, dict):
        return {**size, **values}
    return dataclasses.replace(size, **values)


def set_for_cpu(processor: Any, model_config: Any, cfg: JobConfig) -> list[str]:
    """The job's image size and splitting applied to the processor; what was set, for the log."""
    images = getattr(processor, "image_processor", None)
    if images is None:
        raise UserError(f"model {cfg.model_name!r}: its processor has no image processor (not a vision model?)")
    longest, said = side(processor, model_config, cfg), []
    if hasattr(images, "do_image_splitting"):
        images.do_image_splitting = cfg.image_splitting
        said.append(f"splitting {'on' if cfg.image_splitting else 'off'}")
    size = getattr(images, "size", None)
    edge = size.get("longest_edge") if isinstance(size, dict) else getattr(size, "longest_edge", None)
    if edge and hasattr(images, "merge_size"):  # Qwen2-VL's family: the edges are pixel counts, not sides
        most = min(edge, longest * longest)
        shortest = size.get("shortest_edge") if isinstance(size, dict) else getattr(size, "shortest_edge", None)
        images.size = _with(size, longest_edge=most, shortest_edge=min(shortest or most, most))
        said.append(f"at most {most} pixels an image")
    elif edge:
        # Idefics3's tile (max_image_size) stays the tower's input: each tile makes image_seq_len tokens, so a tile of
        # another size would give the model more features than tokens; the side decides how many tiles splitting cuts
        images.size = _with(size, longest_edge=longest)
        said.append(f"longest side {longest} px")
    return said


class ImageModality:
    name = "image"

    def load_processor(self, cfg: JobConfig) -> Any:
        from transformers import AutoConfig, AutoProcessor

        from tunestudio.worker.modalities.vision_compat import allow_missing_video
        from tunestudio.worker.train import from_pretrained

        allow_missing_video()
        token = cfg.hf_token.get_secret_value() if cfg.hf_token else None
        config = from_pretrained(AutoConfig, cfg.model_name, "config", token=token)
        if getattr(config, "vision_config", None) is None:
            raise UserError(f"model {cfg.model_name!r} is a {config.model_type} model without a vision tower: image "
                            "datasets need a vision-language model (leave is_dataset_image off for text data)")
        processor = from_pretrained(AutoProcessor, cfg.model_name, "processor", token=token)
        if not getattr(processor, "chat_template", None):
            raise UserError(f"model {cfg.model_name!r}: its processor has no chat template; image rows are "
                            "conversations and need one")
        processor.tunestudio_notes = [f"images: {', '.join(set_for_cpu(processor, config, cfg))}"]
        if processor.tokenizer.pad_token is None:
            processor.tokenizer.pad_token = processor.tokenizer.eos_token
        return processor

    def load_model(self, cfg: JobConfig, compute_dtype: torch.dtype) -> torch.nn.Module:
        from transformers import AutoModelForImageTextToText

        from tunestudio.worker.train import load_model

        return load_model(cfg, compute_dtype, AutoModelForImageTextToText)

    def prepare_data(self, cfg: JobConfig, processor: Any, progress: Any = None) -> PreparedData:
        from tunestudio.worker.data import prepare_images

        data = prepare_images(cfg, processor, progress)
        data.notes[:0] = getattr(processor, "tunestudio_notes", [])
        return data

    def generate(self, model: torch.nn.Module, processor: Any, prompt: str) -> str:
        from tunestudio.worker.train import answer_with_images

        return answer_with_images(model, processor, [{"role": "user", "content": prompt}], [], 40)

    def evaluator(self, held_eval: Any, limit: int, places: Sequence[dict[str, Any]] | None,
                  max_length: int) -> Any:
        from tunestudio.worker.train import ImageEvaluator

        return ImageEvaluator.for_job(held_eval, limit, places)

    def serving_loaders(self) -> tuple[Any, Any]:
        from transformers import AutoModelForImageTextToText, AutoProcessor

        from tunestudio.worker.modalities.vision_compat import allow_missing_video

        allow_missing_video()
        return AutoProcessor, AutoModelForImageTextToText
