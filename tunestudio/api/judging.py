"""The judge's answers from the inference pool, by the same path `/v1/chat/completions` takes (resolve the model
id, generate greedily): shared by the API's judgements and `tunestudio judge`."""

from __future__ import annotations

from tunestudio.inference import InferencePool, InferenceUnavailable, JobSource, UnknownModel, resolve
from tunestudio.inference_protocol import GenerateParams
from tunestudio.judge.core import Answerer, JudgeError, Messages

MAX_ANSWER_TOKENS = 256


def pool_answerer(pool: InferencePool, jobs: JobSource, model_id: str,
                  max_tokens: int = MAX_ANSWER_TOKENS) -> Answerer:
    """An Answerer for a chat model id (`<job>`, `<job>:base`): greedy, at most max_tokens."""
    params = GenerateParams(max_tokens=max_tokens, temperature=0.0)

    def answer(messages: Messages) -> str:
        try:
            generation = pool.generate(resolve(jobs, model_id), messages, params)
            text = "".join(generation)
            generation.result()
        except (UnknownModel, InferenceUnavailable) as exc:
            raise JudgeError(f"{model_id}: {exc}") from None
        return text

    return answer
