"""Making data (issue 43): the recipe of the kind "make_data" (`tunestudio.worker.make_data:run`, tunestudio/kinds.py).

documents (sources → sections → chunks with provenance; seed prompts) → teacher (one request per row, its reply
read into messages) → gates (lengths, parse, duplicates) → output (rows appended as they come, keyed by source
and index; the recipe and the report beside the file) → job (the loop: concurrency, budget, progress, stop).

The face is lazy (`tunestudio.worker.lazy_face`): pypdf and python-docx load when a document needs them.
"""

from __future__ import annotations

from tunestudio.worker import lazy_face

# What the other rooms may use, by the module of this room that defines it.
_FACE = {
    "job": ("run", "preview"),
    "documents": ("chunk_sections", "files_of", "read_document", "read_prompts"),
}
__all__ = [name for names in _FACE.values() for name in names]
__getattr__ = lazy_face(__name__, _FACE)
