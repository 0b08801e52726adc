"""/v1/completions: OpenAI's legacy text completions, for every job and its base model (`<id>:base`).

What lm-evaluation-harness's `local-completions` model sends: a batch of prompts (text or token ids), one
choice per prompt with its `index`; `logprobs` (each token's log-probability, its text, where it starts in
the choice's text, and the `top_logprobs` alternatives as token → log-probability), `echo` (the prompt's own
tokens first, the first one's log-probability null). For a loglikelihood it sends token ids with
`max_tokens: 1, logprobs: 1, echo: true` and reads `token_logprobs[ctxlen:-1]`. The validation, limits,
errors (OpenAI's shape) and disconnect handling are chat's (api/routes/openai.py).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from tunestudio.api.deps import ManagerDep
from tunestudio.api.openai_route import OpenAIRoute
from tunestudio.api.routes.openai import StreamOptions, Usage, answer_or_stream, get_pool
from tunestudio.api.schemas import OPENAI_ERRORS
from tunestudio.inference import CompletionParams, InferenceUnavailable, resolve
from tunestudio.inference_protocol import ChoiceDelta, Done, Error, Reply, TokenLogprob

router = APIRouter(prefix="/v1", tags=["OpenAI-compatible chat"], route_class=OpenAIRoute, responses=OPENAI_ERRORS)

MAX_PROMPTS = 256  # one request's batch
MAX_PROMPT_TOKENS = 1_000_000  # token ids in one prompt (the model's context refuses far fewer)


class CompletionRequest(BaseModel):
    # As chat: fields this server does not use (user, ...) are ignored; those it cannot honour are refused.
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1, max_length=300)
    prompt: str | list[str] | list[int] | list[list[int]] = Field(
        description="A text, a list of texts, a list of token ids, or a list of token-id lists: a choice each.")
    max_tokens: int = Field(default=16, ge=0, le=1_000_000, description="0 with echo: score the prompt only.")
    min_tokens: int = Field(default=0, ge=0, le=1_000_000, description="Not OpenAI's: generate at least this many.")
    temperature: float | None = Field(default=None, ge=0.0, le=2.0, description="Default 1; 0 is greedy.")
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: int | None = Field(default=None, ge=0, le=20, description="Top alternatives per token (0-20).")
    echo: bool = False
    n: int = Field(default=1, ge=1, le=1, description="Only one choice per prompt.")
    best_of: int | None = Field(default=None, ge=1, le=1, description="Only 1.")
    suffix: None = Field(default=None, description="Not supported (null only).")

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > 4:
            raise ValueError("at most 4 stop sequences")
        return value

    @field_validator("prompt")
    @classmethod
    def _prompts(cls, value: Any) -> Any:
        if isinstance(value, list):
            if not value:
                raise ValueError("at least one prompt (a text or token ids)")
            if isinstance(value[0], list | str):
                if len(value) > MAX_PROMPTS:
                    raise ValueError(f"at most {MAX_PROMPTS} prompts in one request")
                if isinstance(value[0], list) and any(not ids for ids in value):
                    raise ValueError("a token-id prompt is empty")
            if any(len(p) > MAX_PROMPT_TOKENS for p in value if isinstance(p, list)) or (
                    isinstance(value[0], int) and len(value) > MAX_PROMPT_TOKENS):
                raise ValueError(f"a prompt of more than {MAX_PROMPT_TOKENS} token ids")
        return value

    def prompts(self) -> list[str | list[int]]:
        """One entry per choice: a text, or token ids."""
        if isinstance(self.prompt, str):
            return [self.prompt]
        if isinstance(self.prompt[0], int):
            return [list(self.prompt)]  # type: ignore[arg-type]
        return list(self.prompt)  # type: ignore[arg-type]

    def params(self) -> CompletionParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return CompletionParams(
            max_tokens=self.max_tokens, min_tokens=self.min_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p, stop=stop, seed=self.seed,
            logprobs=self.logprobs, echo=self.echo)


class Logprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: Logprobs | None = None
    finish_reason: Literal["stop", "length"] | None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


def _logprobs(tokens: list[TokenLogprob]) -> Logprobs:
    return Logprobs(tokens=[t.token for t in tokens], token_logprobs=[t.logprob for t in tokens],
                    top_logprobs=[t.top for t in tokens], text_offset=[t.offset for t in tokens])


@router.post("/completions", response_model=Completion,
             responses={200: {"content": {"text/event-stream": {}}, "description": "The choices, or their chunks"}})
async def completions(request: Request, manager: ManagerDep, body: Annotated[CompletionRequest, Body()]) -> Response:
    """Complete each prompt with a job's model (`stream: true`: chunks as they are generated)."""
    spec = resolve(manager, body.model)
    prompts = body.prompts()
    loop = asyncio.get_running_loop()
    replies: asyncio.Queue[Reply] = asyncio.Queue()
    generation = get_pool(request).complete(
        spec, prompts, body.params(), deliver=lambda reply: loop.call_soon_threadsafe(replies.put_nowait, reply))
    meta = {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()), "model": body.model}
    usage_chunk, logprobs = bool(body.stream_options and body.stream_options.include_usage), body.logprobs is not None
    outcome = await answer_or_stream(
        request, replies, generation,
        (lambda: _chunks(replies, generation, meta, usage_chunk, logprobs)) if body.stream else None,
        lambda: _whole(replies, len(prompts), logprobs))
    if isinstance(outcome, Response):
        return outcome
    done, choices = outcome
    usage = Usage(prompt_tokens=done.prompt_tokens, completion_tokens=done.completion_tokens,
                  total_tokens=done.prompt_tokens + done.completion_tokens)
    return JSONResponse(Completion(**meta, choices=choices, usage=usage).model_dump())


async def _whole(replies: asyncio.Queue[Reply], count: int, logprobs: bool) -> tuple[Done, list[CompletionChoice]]:
    texts: list[list[str]] = [[] for _ in range(count)]
    tokens: list[list[TokenLogprob]] = [[] for _ in range(count)]
    reasons: list[str | None] = [None] * count
    while True:
        reply = await replies.get()
        if isinstance(reply, ChoiceDelta):
            texts[reply.index].append(reply.text)
            tokens[reply.index].extend(reply.tokens or [])
            if reply.finish_reason is not None:
                reasons[reply.index] = reply.finish_reason
        elif isinstance(reply, Error):
            raise InferenceUnavailable(reply.message, reply.status, reply.code)
        elif isinstance(reply, Done):
            choices = [CompletionChoice(index=i, text="".join(texts[i]),
                                        logprobs=_logprobs(tokens[i]) if logprobs else None,
                                        finish_reason="length" if reasons[i] == "length" else "stop")
                       for i in range(count)]
            return reply, choices


def _chunk(meta: dict, choice: dict[str, Any] | None, usage: Usage | None = None) -> str:
    data: dict[str, Any] = {**meta, "object": "text_completion", "choices": [choice] if choice else []}
    if usage is not None:
        data["usage"] = usage.model_dump()
    return f"data: {json.dumps(data)}\n\n"


async def _chunks(replies: asyncio.Queue[Reply], generation: Any, meta: dict, usage: bool,
                  logprobs: bool) -> AsyncIterator[str]:
    """One chunk per ChoiceDelta (its text, its tokens' logprobs); a choice's last carries its finish_reason."""
    try:
        while True:
            reply = await replies.get()
            if isinstance(reply, ChoiceDelta):
                if reply.text or reply.finish_reason is not None or reply.tokens:
                    reason = None if reply.finish_reason is None else (
                        "length" if reply.finish_reason == "length" else "stop")
                    yield _chunk(meta, {"index": reply.index, "text": reply.text, "finish_reason": reason,
                                        "logprobs": _logprobs(reply.tokens or []).model_dump() if logprobs
                                        else None})
            elif isinstance(reply, Error):
                body = {"error": {"message": reply.message, "type": "server_error", "param": None,
                                  "code": reply.code}}
                yield f"data: {json.dumps(body)}\n\n"
                return
            elif isinstance(reply, Done):
                if usage:
                    yield _chunk(meta, None, Usage(prompt_tokens=reply.prompt_tokens,
                                                   completion_tokens=reply.completion_tokens,
                                                   total_tokens=reply.prompt_tokens + reply.completion_tokens))
                yield "data: [DONE]\n\n"
                return
    finally:
        generation.cancel()
