"""Chat with a job's result: an inference worker process the parent starts on demand (never torch here).

`resolve(manager, model_id)` finds a job's weights; `InferencePool.generate` streams an answer.
"""

from __future__ import annotations

from tunestudio.inference.models import BASE_SUFFIX, ChatModel, UnknownModel, chat_models, resolve
from tunestudio.inference.pool import Generation, InferencePool, InferenceUnavailable
from tunestudio.inference.protocol import GenerateParams, ModelSpec

__all__ = [
    "BASE_SUFFIX",
    "ChatModel",
    "GenerateParams",
    "Generation",
    "InferencePool",
    "InferenceUnavailable",
    "ModelSpec",
    "UnknownModel",
    "chat_models",
    "resolve",
]
