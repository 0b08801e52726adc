"""The chat panel's settings: which of a job's weights to talk to, its chat template, the prompt the model saw.

- `GET /api/jobs/{id}/chat`: the job's chat models (its final weights as `<id>`, each saved checkpoint as
  `<id>:step-N`, the best step named), its base model, and the chat template its tokenizer folder holds
  (read from the files: `inference.templates`).
- `POST /api/chat/prompt` ({model, messages, tools, tool_choice}): the inference worker renders the messages as
  a chat request would give them to the model (`Render`: the tokenizer alone loads, nothing is generated) and
  answers the exact prompt text, decoded from its tokens with the special ones, its token count and the template
  applied. An image job's turns may hold images (`image_url` parts), expanded into the image tokens the model reads.

`/v1/chat/completions` stays OpenAI's: the page asks for the prompt beside it.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Body, Request
from pydantic import BaseModel, Field

from tunestudio.api.chat_images import request_images
from tunestudio.api.deps import ManagerDep, SettingsDep
from tunestudio.api.errors import ApiError
from tunestudio.api.openai_chat import ChatMessage, ToolRules, template_messages
from tunestudio.api.routes.openai import get_pool
from tunestudio.api.schemas import ERRORS
from tunestudio.inference import (
    BASE_SUFFIX,
    FINISHED,
    InferenceUnavailable,
    UnknownModel,
    chat_template,
    checkpoint_steps,
    resolve,
    spec_for,
)
from tunestudio.inference_protocol import Done, Error, Rendered, Reply

router = APIRouter(prefix="/api", tags=["chat"], responses=ERRORS)
RENDER_WAIT_S = 300.0  # the worker answers in order: a render may wait behind a long answer and a model's load


class ChatChoice(BaseModel):
    id: str = Field(description="The model id for /v1/chat/completions.")
    label: str
    step: int | None = Field(description="The checkpoint's step; None for the job's final weights.")


class ChatSettings(BaseModel):
    models: list[ChatChoice] = Field(description="The job's final weights first, then its checkpoints by step.")
    base: str = Field(description="The base model's id (`<id>:base`), spoken to with the job's tokenizer.")
    template: str | None = Field(description="The chat template of the job's tokenizer; None: it has none (the "
                                             "turns' text is joined by newlines) or it is not in a local folder.")
    template_file: str | None
    images: bool = Field(description="The model reads images (an image job's): messages may hold image_url parts.")


class PromptRequest(ToolRules):
    """A chat request's turns, and its tools (rendered as the template renders them, the call's opener after the
    generation prompt under tool_choice required or named)."""

    model: str = Field(min_length=1, max_length=300)
    messages: list[ChatMessage] = Field(min_length=1, max_length=1000)


class PromptOut(BaseModel):
    model: str
    prompt: str = Field(description="The prompt's tokens decoded with their special tokens: what the model reads.")
    prompt_tokens: int
    template: str | None = Field(description="The chat template the worker's tokenizer applied (None: none).")


def weight_choices(job_id: str, has_final: bool, finished: bool, steps: list[int],
                   best: dict[str, Any]) -> list[ChatChoice]:
    """The job's final weights (a job that did not finish: its newest checkpoint's) first, then its saved steps,
    newest first; the step early stopping found best is named so."""
    models = [ChatChoice(id=job_id, label="final weights" if finished else "newest checkpoint", step=None)] \
        if has_final else []
    for step in reversed(steps):
        label = f"step {step}"
        if best.get("step") == step:
            value = best.get("value")
            label = f"best: step {step}" + (f" ({best.get('metric')} {value:.4g})" if value is not None else "")
        models.append(ChatChoice(id=f"{job_id}:step-{step}", label=label, step=step))
    return models


@router.get("/jobs/{job_id}/chat", response_model=ChatSettings)
def chat_settings(job_id: str, manager: ManagerDep) -> ChatSettings:
    """What the chat panel offers for a job: its weights to choose from, its base model, its chat template."""
    job = manager.get(job_id)
    if not job.spec.trains:
        raise ApiError(409, "not_a_chat_model", f"job {job_id} is no chat model; chat with its source job "
                                                f"{job.source_job}")
    final = spec_for(job, base=False)
    models = weight_choices(job.id, final is not None, job.status in FINISHED, checkpoint_steps(job),
                            (job.result or {}).get("best") or {})
    template, source = chat_template(final.tokenizer) if final is not None else (None, None)
    return ChatSettings(models=models, base=job.id + BASE_SUFFIX, template=template, template_file=source,
                        images=job.config.modality == "image")


@router.post("/chat/prompt", response_model=PromptOut)
async def chat_prompt(request: Request, manager: ManagerDep, settings: SettingsDep,
                      body: Annotated[PromptRequest, Body()]) -> PromptOut:
    """The exact prompt a chat request with these messages gives the model (nothing is generated)."""
    try:
        spec = resolve(manager, body.model)
    except UnknownModel as exc:
        raise ApiError(exc.status, exc.code, str(exc), field="model") from None
    images = await request_images(body.messages, spec, settings.roots())
    try:
        messages = template_messages(body.messages)
    except ValueError as exc:
        raise ApiError(400, "invalid_request", str(exc), field="messages") from None
    loop = asyncio.get_running_loop()
    replies: asyncio.Queue[Reply] = asyncio.Queue()
    try:
        render = get_pool(request).render(spec, messages, tools=body.worker_tools(), images=images,
                                          deliver=lambda reply: loop.call_soon_threadsafe(replies.put_nowait, reply))
    except InferenceUnavailable as exc:
        raise ApiError(exc.status, exc.code, str(exc)) from None
    rendered: Rendered | None = None
    try:
        while True:
            try:
                reply = await asyncio.wait_for(replies.get(), RENDER_WAIT_S)
            except TimeoutError:
                raise ApiError(503, "inference_busy", "the inference worker did not render the prompt in time; "
                                                      "try again when it has answered") from None
            if isinstance(reply, Rendered):
                rendered = reply
            elif isinstance(reply, Error):
                raise ApiError(reply.status, reply.code, reply.message, field=reply.extra.get("param", "messages")
                               if reply.status == 400 else None)
            elif isinstance(reply, Done):
                break
    finally:
        render.cancel()  # a no-op once it is done
    if rendered is None:
        raise ApiError(503, "inference_unavailable", "the inference worker answered without the prompt")
    return PromptOut(model=body.model, prompt=rendered.prompt, prompt_tokens=rendered.prompt_tokens,
                     template=rendered.template)
