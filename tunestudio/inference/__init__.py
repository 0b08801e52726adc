"""Chat with a job's result: an inference worker process the parent starts on demand (never torch here).

`resolve(jobs, model_id)` finds a job's weights; `InferencePool.generate` streams an answer. What this wing
needs of jobs and of where a worker runs comes in from the caller (the manager as a `JobSource`, an executor
factory); it imports nothing of jobs/ or worker/, and talks to its worker in `tunestudio.inference_protocol`.
"""

from __future__ import annotations

from tunestudio.inference.models import (
    BASE_SUFFIX,
    FINISHED,
    SUFFIX,
    ChatJob,
    ChatModel,
    JobSource,
    UnknownModel,
    chat_models,
    checkpoint_steps,
    fine_tuned_name,
    resolve,
    spec_for,
    weights_folder,
)
from tunestudio.inference.pool import Generation, InferencePool, InferenceUnavailable, WorkerExecutor
from tunestudio.inference.templates import chat_template
from tunestudio.inference_protocol import CompletionParams, GenerateParams, ModelSpec, Tools

__all__ = [
    "BASE_SUFFIX",
    "FINISHED",
    "SUFFIX",
    "ChatJob",
    "ChatModel",
    "CompletionParams",
    "GenerateParams",
    "Generation",
    "InferencePool",
    "InferenceUnavailable",
    "JobSource",
    "ModelSpec",
    "Tools",
    "UnknownModel",
    "WorkerExecutor",
    "chat_models",
    "chat_template",
    "checkpoint_steps",
    "fine_tuned_name",
    "resolve",
    "spec_for",
    "weights_folder",
]
