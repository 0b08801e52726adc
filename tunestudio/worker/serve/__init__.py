"""Serving: the chat worker (the kind "inference" of child.py). inference runs its loop over the requests,
generation loads a finished job's model (through its modality) and answers chat, completion answers
/v1/completions' token prompts with log-probabilities, serving keeps the copy a model answers from (fp32, or int8).

The face is lazy (`tunestudio.worker.lazy_face`): importing it loads no torch; inference.py loads generation and
completion (torch, transformers) when its loop starts.
"""

from __future__ import annotations

from tunestudio.worker import lazy_face

# What the other rooms may use, by the module of this room that defines it.
_FACE = {
    "inference": ("run",),
}
__all__ = [name for names in _FACE.values() for name in names]
__getattr__ = lazy_face(__name__, _FACE)
