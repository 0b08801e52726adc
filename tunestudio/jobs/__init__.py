"""The parent's side of jobs. Never imports torch or the HF libraries.

This is the wing's face: what the faces (cli/, api/, data_report/) may use of it, and all they import from it
(tests/test_layers.py holds them to it); the rest of jobs/ is its own. sweeps/ comes in through its door,
`jobs.manager`.
"""

from tunestudio.jobs.artefacts import owned as owned_artefacts
from tunestudio.jobs.evalrows import ORDER_KEYS, Order
from tunestudio.jobs.executor import inference_executor
from tunestudio.jobs.manager import JobManager, Subscription
from tunestudio.jobs.models import Job, JobConflict, JobEvent, JobKind, JobNotFound, QueueFull
from tunestudio.jobs.prewarm import ready_context as warm_context
from tunestudio.jobs.status import RUNNING, JobStatus
from tunestudio.jobs.store import INT64_MAX, StoreError, StoreUnavailable, open_error

__all__ = ["INT64_MAX", "ORDER_KEYS", "RUNNING", "Job", "JobConflict", "JobEvent", "JobKind", "JobManager",
           "JobNotFound", "JobStatus", "Order", "QueueFull", "StoreError", "StoreUnavailable", "Subscription",
           "inference_executor", "open_error", "owned_artefacts", "warm_context"]
