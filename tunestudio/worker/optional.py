"""Optional libraries a fresh training process leaves unimported when its job does not use them.

peft imports bitsandbytes whenever it is installed (peft/helpers.py), and bitsandbytes' `torch.compile` decorators
load torch's compiler (torch._inductor, about 580 modules); trl imports wandb whenever it is installed. A job that
trains LoRA or full weights and reports nowhere near wandb paid that in every fresh process: a spawned worker, each
torchrun rank, each Ray worker (bench/worker_imports.py measures it). `hide_unused` marks them missing before
anything imports them: `sys.modules[name] = None` makes `import name` raise ImportError and
`importlib.util.find_spec(name)` return None, so peft, transformers and trl take their own "not installed" paths.

Only a process that has not imported them yet is changed: a worker forked from the prewarmed forkserver (which
imported everything once, for every kind of job and for the chat worker, whose requests may ask for 4-bit weights)
keeps what it has. This module uses the standard library only: the child's door (worker/child.py) reaches it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

BITSANDBYTES = "bitsandbytes"
WANDB = "wandb"
# The optimizers that are bitsandbytes' (transformers' `optim` names); worker/train/train.py swaps them on a CPU.
BNB_OPTIMIZERS = frozenset({"adamw_8bit", "adamw_bnb_8bit", "paged_adamw_8bit", "paged_adamw_32bit", "lion_8bit",
                            "lion_32bit"})


def _field(config: Any, name: str) -> Any:
    value = config.get(name) if isinstance(config, Mapping) else getattr(config, name, None)
    return getattr(value, "value", value)  # an enum's value (TrainingType.QLORA -> "qlora")


def _unquantized_local(model_name: Any) -> bool:
    """A folder on this machine whose config.json names no quantization (a hub name, an adapter folder, an
    unreadable config: not known, so not assumed)."""
    if not isinstance(model_name, str) or not model_name:
        return False
    try:
        config = json.loads((Path(model_name) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "quantization_config" not in config


def _names_qlora(training_type: Any) -> bool:
    """Whether it names QLoRA in any of the seed's spellings ("QLoRA", "q-lora"; "LoRA/QLoRA" too: not known to
    be plain LoRA)."""
    return isinstance(training_type, str) and "qlora" in "".join(c for c in training_type.lower() if c.isalnum())


def uses(config: Any) -> set[str]:
    """Which of the optional libraries a training job's config (a JobConfig, its JSON form, or a file
    `python -m tunestudio.worker` reads, in the seed's spellings too) may import."""
    used = set()
    if (_names_qlora(_field(config, "training_type")) or _field(config, "load_in_4bit")
            or _field(config, "optim") in BNB_OPTIMIZERS or not _unquantized_local(_field(config, "model_name"))):
        used.add(BITSANDBYTES)
    if _field(config, "enable_wandb") or WANDB in (_field(config, "report_to") or ()):
        used.add(WANDB)
    return used


def hide_unused(config: Any) -> list[str]:
    """Mark missing, in this process, the optional libraries the job does not use and nothing imported yet; returns
    the names hidden. A config that cannot be read hides nothing (the job's own validation then says why)."""
    try:
        used = uses(config)
    except (TypeError, AttributeError):
        return []
    hidden = [name for name in (BITSANDBYTES, WANDB) if name not in used and name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]
    return hidden
