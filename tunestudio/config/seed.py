"""Every spelling a job config also takes, made canonical in one before-validator (`normalise`).

The seed's request fields under their seed names and spellings ("LoRA/QLoRA", "Full Finetuning",
learning_rate as a string, "" for unset), method and format aliases, words for booleans, one path for a
list: each field's raw value becomes the value the model validates. Values that only meant something to
the seed's own engine ("unsloth" gradient checkpointing, the 8-bit optimizers) are kept as given; the
worker maps them to their nearest equivalent and says so in a warning event. The defaults that depend on
the method (methods.MethodSpec.defaults) are filled in here too, when the field is not given.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tunestudio.config.methods import METHOD_ALIASES, METHOD_SPECS
from tunestudio.config.vocabulary import FORMAT_ALIASES, ROLE_ALIASES

__all__ = ["blank_to_none", "normalise"]


def blank_to_none(value: Any) -> Any:
    if isinstance(value, str) and value.strip() == "":
        return None
    return value


def _training_type(raw: Any, data: dict[str, Any]) -> Any:
    """The seed's training_type spellings; "LoRA/QLoRA" depends on load_in_4bit."""
    if not isinstance(raw, str):
        return raw
    key = raw.strip().lower().replace("-", "").replace("_", "").replace(" ", "")
    if key == "lora/qlora":
        return "qlora" if data.get("load_in_4bit", False) else "lora"
    if key in ("fullfinetuning", "fullfinetune", "full"):
        return "full"
    return key if key in ("lora", "qlora") else raw


def _format(value: Any) -> Any:
    if value is None:
        return "auto"
    if isinstance(value, str):
        key = value.strip().lower()
        return FORMAT_ALIASES.get(key, key)
    return value


def _lower(value: Any) -> Any:
    return value.strip().lower() if isinstance(value, str) else value


def _switch(value: Any) -> Any:
    """true/on/yes and false/off/no/none/"" as booleans; any other word (auto, unsloth) as it is."""
    if isinstance(value, str):
        word = value.strip().lower()
        if word in ("true", "on", "yes"):
            return True
        if word in ("false", "off", "no", "none", ""):
            return False
        return word
    return value


def _path_list(value: Any) -> Any:
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value.strip() else []
    return value


def _roles(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: ROLE_ALIASES.get(str(v).strip().lower(), str(v).strip().lower()) for k, v in value.items()}
    return value


def _modules(value: Any) -> Any:
    if isinstance(value, str):
        if value.strip() in ("", "all-linear", "all_linear"):
            return None
        return [m.strip() for m in value.split(",") if m.strip()]
    if isinstance(value, list) and not value:
        return None
    return value


_BLANK_IS_UNSET = ("hf_dataset", "subset", "eval_split", "output_dir", "resume_from_checkpoint", "hf_token",
                   "wandb_token", "warmup_steps", "warmup_ratio", "dataset_slice_start", "dataset_slice_end",
                   "reward_format_pattern", "early_stopping", "early_stopping_rows")
_FIELDS: dict[str, Callable[[Any], Any]] = {
    **dict.fromkeys(_BLANK_IS_UNSET, blank_to_none),
    "reward_weights": lambda value: None if value == [] else blank_to_none(value),
    "format_type": _format,
    "optim": _lower,
    "lr_scheduler_type": _lower,
    "gradient_checkpointing": _switch,
    "padding_free": _switch,
    "local_datasets": _path_list,
    "custom_format_mapping": _roles,
    "target_modules": _modules,
}


def normalise(data: Any) -> Any:
    """A raw config (a mapping) with every field in its canonical spelling; anything else as it is."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    if isinstance(data.get("method"), str):
        word = data["method"].strip().lower().replace("-", "_").replace(" ", "_")
        data["method"] = METHOD_ALIASES.get(word, word)
        spec = METHOD_SPECS.get(data["method"])
        for name, value in (spec.defaults.items() if spec else ()):
            if data.get(name) is None:
                data[name] = value
    if "training_type" in data:
        data["training_type"] = _training_type(data["training_type"], data)
    for name, canonical in _FIELDS.items():
        if name in data:
            data[name] = canonical(data[name])
    return data
