"""Vision-language processors on a CPU torch without torchvision: images work, videos are refused.

transformers 5.24 builds every vision-language processor with a video processor, and its video processors need
torchvision; torchvision's wheels on PyPI are CUDA builds whose operators do not load against the CPU build of torch
this project installs ("operator torchvision::nms does not exist" on import), and no CPU build is on the registries
these machines reach. Without torchvision, building or loading a processor fails before any image is read, though
images never touch torchvision (the image processors fall back to their Pillow versions).

`allow_missing_video()` (idempotent, in the worker only) lets a processor have no video processor: the family's
own video processor where it imports without torchvision (SmolVLM's does, and its chat template reads its frame
settings), else none (Qwen2-VL's); saving skips a missing one. With torchvision installed it changes nothing.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

_done = False


def torchvision_available() -> bool:
    try:
        import torchvision  # noqa: F401
    except Exception:  # a CUDA wheel raises RuntimeError on import, not ImportError
        return False
    return True


def allow_missing_video() -> None:
    global _done
    if _done or torchvision_available():
        _done = True
        return
    from transformers import processing_utils, video_processing_utils

    mixin = processing_utils.ProcessorMixin
    check, save = mixin.check_argument_for_proper_class, mixin.save_pretrained

    def check_argument(self: Any, argument_name: str, argument: Any) -> Any:
        # the class check resolves the mixin's name through a placeholder without torchvision: checked here instead
        if argument_name != "video_processor":
            return check(self, argument_name, argument)
        if argument is not None and not isinstance(argument, video_processing_utils.VideoProcessorMixin):
            raise TypeError(f"Received a {type(argument).__name__} for argument video_processor, but a "
                            "VideoProcessorMixin was expected.")
        return video_processing_utils.VideoProcessorMixin

    def save_pretrained(self: Any, *args: Any, **kwargs: Any) -> Any:
        present = [name for name in self.get_attributes() if getattr(self, name, None) is not None]
        if len(present) == len(self.get_attributes()):
            return save(self, *args, **kwargs)
        self.get_attributes = lambda: present  # this save only: the instance hides the class's list
        try:
            return save(self, *args, **kwargs)
        finally:
            del self.get_attributes

    mixin.check_argument_for_proper_class = check_argument
    mixin.save_pretrained = save_pretrained
    # loading a processor asks AutoVideoProcessor (a placeholder without torchvision) through this table
    table = processing_utils.MODALITY_TO_AUTOPROCESSOR_MAPPING
    table._MAPPING_NAMES = {**table._MAPPING_NAMES, "video_processor": (__name__, "VideoProcessorOrNone")}
    _done = True


class VideoProcessorOrNone:
    """What a processor loads as its video processor when torchvision is missing."""

    @classmethod
    def from_pretrained(cls, name: str, *args: Any, **kwargs: Any) -> Any:
        return _video_processor_or_none(name, **kwargs)


def _video_processor_or_none(name: str, **kwargs: Any) -> Any:
    """The family's video processor where its module imports without torchvision, else None."""
    model_type = _model_type(name, kwargs)
    if model_type is None:
        return None
    module = f"transformers.models.{model_type}.video_processing_{model_type}"
    if importlib.util.find_spec(module) is None:
        return None
    try:
        found = importlib.import_module(module)
    except ImportError:
        return None
    classes = [v for k, v in vars(found).items() if k.endswith("VideoProcessor") and isinstance(v, type)
               and v.__module__ == module]
    return classes[0]() if classes else None


def _model_type(name: str, kwargs: dict[str, Any]) -> str | None:
    """The family's folder name in transformers: from the model's config, else (a job's folder holds an adapter and
    the processor, no config.json) from the processor class its processor_config.json names."""
    import json
    from pathlib import Path

    import transformers
    from transformers.models.auto.configuration_auto import AutoConfig

    try:
        return AutoConfig.from_pretrained(name, **{k: v for k, v in kwargs.items() if k == "token"}).model_type
    except (OSError, ValueError):
        pass
    try:
        saved = json.loads((Path(name) / "processor_config.json").read_text(encoding="utf-8"))
        module = getattr(transformers, saved["processor_class"]).__module__  # transformers.models.<type>.processing_x
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[1] == "models" else None
