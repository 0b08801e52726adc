"""/v1: chat with finished jobs through OpenAI's API shape, so OpenAI's own clients work unchanged.

`GET /v1/models` lists every job one can chat with by its id, and its base
model as `<job id>:base`. `POST /v1/chat/completions` answers, whole or as
Server-Sent Events chunks ending with `data: [DONE]`. Errors take OpenAI's
shape, `{"error": {"message", "type", "param", "code"}}`, with OpenAI's
statuses (400 for a bad request, 404 for an unknown model or an export job,
409 for a job whose weights a later job replaced). The token rules of /api apply.
`GET /api/inference` says what the inference worker holds.

Beyond OpenAI's fields, a request may give `min_tokens` (as vLLM does). `tools`, `tool_choice` and
`parallel_tool_calls`, and turns with calls and tool results, are read by api/openai_chat.py; an answer carries
`tool_calls` (finish_reason `tool_calls`) and, where the template thinks, `reasoning_content` (as vLLM's).
An image job's model reads images in user turns (`image_url` parts: data: URLs, or files inside the server's model
and data folders; api/chat_images.py); any other model refuses them (400).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Body, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from tunestudio.api.chat_images import request_images
from tunestudio.api.deps import ManagerDep, SettingsDep
from tunestudio.api.errors import ApiError
from tunestudio.api.openai_chat import (
    AssistantMessage,
    ChatMessage,
    OutputReader,
    ToolRules,
    answer_message,
    template_messages,
)
from tunestudio.api.openai_route import OpenAIRoute
from tunestudio.api.schemas import OPENAI_ERRORS
from tunestudio.inference import (
    GenerateParams,
    Generation,
    InferencePool,
    InferenceUnavailable,
    chat_models,
    resolve,
)
from tunestudio.inference_protocol import Delta, Done, Error, Reply, Started, Tools

T = TypeVar("T")
A = TypeVar("A")  # a worker's reply of one kind (one_answer)


router = APIRouter(prefix="/v1", tags=["OpenAI-compatible chat"], route_class=OpenAIRoute, responses=OPENAI_ERRORS)
status_router = APIRouter(prefix="/api/inference", tags=["chat"])


# --- requests and answers -----------------------------------------------------------------
class StreamOptions(BaseModel):
    include_usage: bool = False


class ChatCompletionRequest(ToolRules):
    # Clients send fields this server does not use (user, metadata, store, ...): ignored, as OpenAI-compatible
    # servers do. Fields it cannot honour (n > 1) are refused; `tools` and `tool_choice` are honoured (ToolRules).
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1, max_length=300)
    messages: list[ChatMessage] = Field(min_length=1, max_length=1000)
    max_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    min_tokens: int = Field(default=0, ge=0, le=1_000_000, description="Not OpenAI's: generate at least this many.")
    temperature: float | None = Field(default=None, ge=0.0, le=2.0, description="Default 1; 0 is greedy.")
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=1, description="Only one choice per request.")

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > 4:
            raise ValueError("at most 4 stop sequences")
        return value

    def params(self) -> GenerateParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return GenerateParams(
            max_tokens=self.max_completion_tokens or self.max_tokens, min_tokens=self.min_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p, stop=stop, seed=self.seed)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: Literal["stop", "length", "tool_calls"]
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "tunestudio"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def get_pool(request: Request) -> InferencePool:
    return request.app.state.inference


# --- routes ------------------------------------------------------------------------------------
@router.get("/models", response_model=ModelList)
def list_models(manager: ManagerDep) -> ModelList:
    """Every finished, stopped, or interrupted-with-a-checkpoint job, and each one's base model (`<id>:base`)."""
    return ModelList(data=[ModelCard(id=m.id, created=int(m.job.finished_at or m.job.created_at))
                           for m in chat_models(manager)])


@router.get("/models/{model_id}", response_model=ModelCard)
def get_model(model_id: str, manager: ManagerDep) -> ModelCard:
    spec = resolve(manager, model_id)
    job = manager.get(spec.job_id)
    return ModelCard(id=model_id, created=int(job.finished_at or job.created_at))


@router.post("/chat/completions", response_model=ChatCompletion,
             responses={200: {"content": {"text/event-stream": {}}, "description": "The answer, or its chunks"}})
async def chat_completions(
    request: Request, manager: ManagerDep, settings: SettingsDep, body: Annotated[ChatCompletionRequest, Body()]
) -> Response:
    """Answer a conversation with a job's model (`stream: true`: chunks as they are generated); with `tools`, its
    calls as `tool_calls`; an image job's model, with images in the user's turns."""
    spec = resolve(manager, body.model)
    images = await request_images(body.messages, spec, settings.roots())
    params = body.params()
    try:
        messages = template_messages(body.messages)
    except ValueError as exc:
        raise ApiError(400, "invalid_request", str(exc), field="messages") from None
    tools = body.worker_tools()
    loop = asyncio.get_running_loop()
    replies: asyncio.Queue[Reply] = asyncio.Queue()
    generation = get_pool(request).generate(
        spec, messages, params, deliver=lambda reply: loop.call_soon_threadsafe(replies.put_nowait, reply),
        tools=tools, images=images)
    meta = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()), "model": body.model}
    usage = bool(body.stream_options and body.stream_options.include_usage)
    outcome = await answer_or_stream(
        request, replies, generation,
        (lambda: _chunks(replies, generation, meta, usage, tools)) if body.stream else None,
        lambda: _whole(replies))
    if isinstance(outcome, Response):
        return outcome
    reply, text = outcome
    finish = "length" if reply.finish_reason == "length" else "stop"
    reader = OutputReader(generation.started, tools)
    if reader.active:  # its template calls tools or thinks: read the output
        reader.deltas(text)
        _, parsed, finish = reader.finish(finish)
        message = answer_message(parsed)
    else:
        message = AssistantMessage(content=text)
    answer = ChatCompletion(**meta, choices=[Choice(message=message, finish_reason=finish)], usage=_usage(reply))
    body_out = answer.model_dump()
    body_out["choices"][0]["message"] = message.answer()
    return JSONResponse(body_out)


async def one_answer(start: Callable[[Callable[[Reply], None]], Generation], kind: type[A], wait_s: float,
                     what: str) -> A:
    """The worker's one reply of `kind` to a request that `start(deliver)` queues (a reward model's scores, a
    transcription), read until its Done: an Error is raised as InferenceUnavailable; silence past wait_s (a model's
    first load included) and an end without the reply (the pool closing) are 503s naming `what`."""
    loop = asyncio.get_running_loop()
    replies: asyncio.Queue[Reply] = asyncio.Queue()
    work = start(lambda reply: loop.call_soon_threadsafe(replies.put_nowait, reply))
    found: A | None = None
    try:
        async with asyncio.timeout(wait_s):
            while True:
                reply = await replies.get()
                if isinstance(reply, kind):
                    found = reply
                elif isinstance(reply, Error):
                    raise InferenceUnavailable(reply.message, reply.status, reply.code, **reply.extra)
                elif isinstance(reply, Done):
                    break
    except TimeoutError:
        raise ApiError(503, "inference_busy", f"{what} did not answer in {wait_s:g} s") from None
    finally:
        work.cancel()
    if found is None:
        raise ApiError(503, "inference_unavailable", f"{what} gave no answer: it was cancelled (the inference "
                       "worker is closing)")
    return found


async def answer_or_stream(request: Request, replies: asyncio.Queue[Reply], generation: Generation,
                           stream: Callable[[], AsyncIterator[str]] | None,
                           collect: Callable[[], Coroutine[Any, Any, T]]) -> Response | T:
    """The worker's first reply (Started; an Error raises InferenceUnavailable), then a StreamingResponse of
    `stream()` when streaming, else `collect()`'s result. Until the answer is sent, a client that goes away
    cancels the generation at once (the worker stops before its next token) and gets a 499; a stream's client is
    watched by StreamingResponse instead."""
    gone = asyncio.ensure_future(client_gone(request))
    streaming = False
    try:
        first = await unless_gone(replies.get(), gone)  # Started, or an Error (a bad prompt, an unloadable model)
        if first is None:
            return Response(status_code=499)
        if isinstance(first, Error):
            raise InferenceUnavailable(first.message, first.status, first.code, **first.extra)
        assert isinstance(first, Started)
        if stream is not None:
            streaming = True
            return StreamingResponse(stream(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
        collected = await unless_gone(collect(), gone)
        return Response(status_code=499) if collected is None else collected
    finally:
        gone.cancel()
        if not streaming:
            generation.cancel()  # a no-op once it is done


async def client_gone(request: Request) -> None:
    """Returns once the client has gone away. The body is read already: the server's next message is the
    disconnect (uvicorn sends it when the connection closes, or once the answer is sent)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_gone(work: Coroutine[Any, Any, T], gone: asyncio.Future[None]) -> T | None:
    """The work's result; None (the work cancelled) if the client goes away first."""
    task = asyncio.ensure_future(work)
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
    return task.result() if task.done() and not task.cancelled() else None


async def _whole(replies: asyncio.Queue[Reply]) -> tuple[Done, str]:
    """The whole answer: the final Done and the text; an Error raises InferenceUnavailable."""
    parts: list[str] = []
    while True:
        reply = await replies.get()
        if isinstance(reply, Delta):
            parts.append(reply.text)
        elif isinstance(reply, Error):
            raise InferenceUnavailable(reply.message, reply.status, reply.code)
        elif isinstance(reply, Done):
            return reply, "".join(parts)


def _usage(done: Done) -> Usage:
    return Usage(prompt_tokens=done.prompt_tokens, completion_tokens=done.completion_tokens,
                 total_tokens=done.prompt_tokens + done.completion_tokens)


def _chunk(meta: dict, delta: dict[str, Any], finish: str | None = None, usage: Usage | None = None) -> str:
    data: dict[str, Any] = {**meta, "object": "chat.completion.chunk",
                            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}
    if usage is not None:
        data["choices"], data["usage"] = [], usage.model_dump()
    return f"data: {json.dumps(data)}\n\n"


async def _chunks(replies: asyncio.Queue[Reply], generation: Any, meta: dict, usage: bool,
                  tools: Tools | None) -> AsyncIterator[str]:
    """OpenAI's chunks (content, reasoning_content and tool_calls deltas as the output settles them). A client
    that goes away cancels the stream task here, and so the generation."""
    reader = OutputReader(generation.started, tools)
    try:
        yield _chunk(meta, {"role": "assistant", "content": ""})
        while True:
            reply: Reply | None = await replies.get()
            text: list[str] = []
            while isinstance(reply, Delta):  # a client that fell behind gets one chunk for what waited
                text.append(reply.text)
                reply = replies.get_nowait() if not replies.empty() else None
            if text:
                for delta in reader.deltas("".join(text)) if reader.active else [{"content": "".join(text)}]:
                    yield _chunk(meta, delta)
            if isinstance(reply, Error):
                yield _error_chunk(reply.message, "server_error", reply.code)
                return
            if isinstance(reply, Done):
                finish = "length" if reply.finish_reason == "length" else "stop"
                if reader.active:
                    try:
                        last, _, finish = reader.finish(finish)
                    except ApiError as exc:  # no valid call where one must come, or one that half-parses
                        yield _error_chunk(exc.message, "invalid_request_error", exc.code)
                        return
                    for delta in last:
                        yield _chunk(meta, delta)
                yield _chunk(meta, {}, finish)
                if usage:
                    yield _chunk(meta, {}, usage=_usage(reply))
                yield "data: [DONE]\n\n"
                return
    finally:
        generation.cancel()


def _error_chunk(message: str, kind: str, code: str) -> str:
    return f"data: {json.dumps({'error': {'message': message, 'type': kind, 'param': None, 'code': code}})}\n\n"


@status_router.get("")
def inference_status(request: Request) -> dict[str, Any]:
    """The inference worker: stopped, starting or running; its pid, device, loaded models, requests in flight."""
    return get_pool(request).status()
