"""Exporting: the recipe of the kind "export" (job: `tunestudio.worker.export:run`, tunestudio/kinds.py), which
finds what the job left (source), merges an adapter into its base (model), converts to GGUF (gguf, with llama.cpp's
converter in a child of its own: gguf_driver) and writes an Ollama Modelfile (modelfile), or pushes to the hub (hub).

The face is lazy (`tunestudio.worker.lazy_face`): the recipe's module loads when the child asks for `run`.
"""

from __future__ import annotations

from tunestudio.worker import lazy_face

# What the other rooms may use, by the module of this room that defines it.
_FACE = {
    "job": ("run",),
}
__all__ = [name for names in _FACE.values() for name in names]
__getattr__ = lazy_face(__name__, _FACE)
