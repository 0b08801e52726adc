"""The child side of a job. Importing this package is light; the heavy modules
(torch, transformers, peft, trl, datasets) load only inside the worker process,
from `tunestudio.worker.main`."""
