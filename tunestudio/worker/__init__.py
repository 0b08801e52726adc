"""The child side of a job. Importing this package is light; the heavy modules
(torch, transformers, peft, trl, datasets) load only inside the worker process,
from `tunestudio.worker.main`.

Its rooms, each a package whose `__init__` is its face (what the others may use,
in `__all__`): data/ (a dataset, read to split), train/ (model, trainer, its
measures and callbacks, evaluation), modalities/ (one object per kind of data),
serve/ (the chat worker), export/ (the export recipe), ray/ (a job on a Ray
cluster). The loose modules are the entries (main, bench, child, rank, launch,
tiny) and the ground every room stands on (channel, errors, hub, phases,
resources, rewards). tests/test_layers.py holds the floors between them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_face(package: str, homes: Mapping[str, Sequence[str]]) -> Callable[[str], Any]:
    """A room's `__getattr__` (PEP 562): each name of its face, from the module of the room that defines it
    (`homes`: module -> names), imported when the name is first asked for. So a room that wants the model loader
    does not load TRL with it, and `python -m tunestudio.worker.train.tracking` starts without torch."""
    where = {name: module for module, names in homes.items() for name in names}
    if len(where) != sum(len(names) for names in homes.values()):
        raise ValueError(f"{package}: a name is on its face twice")

    def get(name: str) -> Any:
        if name not in where:  # a submodule's name falls through to the import system: `from room import module`
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{where[name]}"), name)

    return get
