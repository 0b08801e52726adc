"""A reward model's scores of (prompt, answer) pairs, for `/v1/rewards`: the job's reward model (train/'s
RewardModel: its adapter merged into its base with the score head it trained, or its merged folder), loaded once
and kept while the same weights are asked for (one at a time: a chat model and a reward model share the worker)."""

from __future__ import annotations

import threading
from typing import Any

from tunestudio.inference_protocol import Done, Score, Scored
from tunestudio.worker.errors import UserError, UserFacing
from tunestudio.worker.train import RewardModel

_loaded: dict[tuple[str, str], Any] = {}  # (weights, fingerprint) -> the RewardModel: one kept


def _model(request: Score) -> Any:
    spec = request.spec
    if spec.base:
        raise UserFacing(f"{spec.model_id}: a base model has no trained score head; score with the reward job's "
                         f"id ({spec.job_id})", 400, "not_a_reward_model", param="model")
    key = (spec.weights, spec.fingerprint)
    if key not in _loaded:
        _loaded.clear()
        try:
            _loaded[key] = RewardModel(spec.weights, spec.base_model if spec.kind == "adapter" else None)
        except UserError as exc:
            raise UserFacing(f"{spec.model_id}: {exc}", 400, "not_a_reward_model", param="model") from None
    return _loaded[key]


def score(models: Any, request: Score, replies: Any, halt: threading.Event) -> None:
    import torch

    if torch.get_num_threads() != request.threads:
        torch.set_num_threads(request.threads)
    model = _model(request)
    scores = []
    for prompt, answer in request.items:
        if halt.is_set():
            replies.put(Done(request.request_id, "cancelled"))
            return
        scores.append(model.score(prompt, answer))
    replies.put(Scored(request.request_id, scores))
    replies.put(Done(request.request_id, "stop", len(scores)))
