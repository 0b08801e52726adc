"""Answers from the inference pool, by the same path `/v1/chat/completions` takes (resolve the model id, generate):
shared by the API's judgements and arena and `tunestudio judge`.

An answer is bounded: when the inference worker says nothing about it (no start, no text, no end) for
`idle_timeout` seconds, it is cancelled and its row has no answer (an error naming the model and the wait, never a
tie), so a hung worker cannot hold a judgement forever. A long answer that keeps streaming is not cut. A
judgement's cancel cancels the answer under way within CANCEL_POLL_S.
"""

from __future__ import annotations

import queue
import threading
import time

from tunestudio.inference import InferencePool, InferenceUnavailable, JobSource, UnknownModel, resolve
from tunestudio.inference_protocol import Delta, Done, Error, GenerateParams, Reply
from tunestudio.judge import Answerer, JudgeError, Messages

MAX_ANSWER_TOKENS = 256
ANSWER_IDLE_S = 300.0  # the worker's silence about one answer (a model's first load included) that ends it
CANCEL_POLL_S = 0.2  # how soon a judgement's cancel ends an answer under way


def pool_answerer(pool: InferencePool, jobs: JobSource, model_id: str, max_tokens: int = MAX_ANSWER_TOKENS,
                  idle_timeout: float = ANSWER_IDLE_S, cancel: threading.Event | None = None,
                  temperature: float = 0.0, top_p: float = 1.0) -> Answerer:
    """An Answerer for a chat model id (`<job>`, `<job>:base`): greedy unless a temperature is given (the arena's),
    at most max_tokens; JudgeError when the model is unknown, the worker fails, it says nothing for idle_timeout
    seconds, or `cancel` is set (the request is cancelled in the last two cases)."""
    params = GenerateParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p)

    def answer(messages: Messages) -> str:
        replies: queue.SimpleQueue[Reply] = queue.SimpleQueue()
        try:
            generation = pool.generate(resolve(jobs, model_id), messages, params, deliver=replies.put)
        except (UnknownModel, InferenceUnavailable) as exc:
            raise JudgeError(f"{model_id}: {exc}") from None
        text: list[str] = []
        silent_until = time.monotonic() + idle_timeout
        while True:
            if cancel is not None and cancel.is_set():
                generation.cancel()
                raise JudgeError(f"{model_id}: the answer was cancelled (the judgement was)")
            left = silent_until - time.monotonic()
            if left <= 0:
                generation.cancel()
                raise JudgeError(f"{model_id}: the inference worker said nothing for {idle_timeout:g} s "
                                 f"({len(text)} pieces of text so far); the answer was cancelled")
            try:  # with a cancel to watch, wake now and then to look at it
                reply = replies.get(timeout=min(left, CANCEL_POLL_S) if cancel is not None else left)
            except queue.Empty:
                continue
            silent_until = time.monotonic() + idle_timeout
            if isinstance(reply, Delta):
                text.append(reply.text)
            elif isinstance(reply, Error):
                raise JudgeError(f"{model_id}: {reply.message}")
            elif isinstance(reply, Done):
                if reply.finish_reason == "cancelled":  # the pool closed under it: a part of an answer is none
                    raise JudgeError(f"{model_id}: the answer was cancelled (the inference pool is closing)")
                return "".join(text)

    return answer
