"""POST /v1/rewards: a reward job's model scores (prompt, answer) pairs.

OpenAI has no such route; this one follows its conventions (the model by id, `input` a list, `data` a list with
`index`, errors in OpenAI's shape), so any HTTP client, or the official `openai` client's generic
`client.post("/rewards", ...)`, calls it. A prompt is text or chat turns (system and user, ending with the user's);
an answer is text or the assistant turns. The model is a reward job's id (method reward); the score is its head's
output for the answer, as the job's own evaluation scored its held-out pairs: higher is better, and only
differences between answers to the same prompt mean anything.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Request
from pydantic import BaseModel, ConfigDict, Field

from tunestudio.api.deps import ManagerDep
from tunestudio.api.errors import ApiError
from tunestudio.api.openai_route import OpenAIRoute
from tunestudio.api.routes.openai import get_pool, one_answer
from tunestudio.api.schemas import OPENAI_ERRORS
from tunestudio.inference import resolve
from tunestudio.inference_protocol import Scored

router = APIRouter(prefix="/v1", tags=["OpenAI-compatible chat"], route_class=OpenAIRoute, responses=OPENAI_ERRORS)

MAX_ITEMS = 256
SCORE_WAIT_S = 600.0  # a reward model's first load included
Text = Annotated[str, Field(max_length=100_000)]


class Turn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant"]
    content: Text


class Item(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prompt: Text | list[Turn] = Field(description="Text, or turns ending with the user's.")
    answer: Text | list[Turn] = Field(description="Text, or the assistant's turns.")

    def as_pair(self) -> tuple[Any, Any]:
        prompt = self.prompt if isinstance(self.prompt, str) else [t.model_dump() for t in self.prompt]
        answer = self.answer if isinstance(self.answer, str) else [t.model_dump() for t in self.answer]
        if isinstance(prompt, str) and isinstance(answer, list):
            prompt = [{"role": "user", "content": prompt}]
        return prompt, answer


class RewardRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1, max_length=300, description="A reward job's id.")
    input: list[Item] = Field(min_length=1, max_length=MAX_ITEMS)


class Reward(BaseModel):
    object: Literal["reward"] = "reward"
    index: int
    score: float


class RewardList(BaseModel):
    object: Literal["list"] = "list"
    model: str
    created: int
    data: list[Reward]


@router.post("/rewards", response_model=RewardList)
async def rewards(request: Request, manager: ManagerDep, body: Annotated[RewardRequest, Body()]) -> RewardList:
    """Score each (prompt, answer) with a reward job's model."""
    spec = resolve(manager, body.model)  # 404 in OpenAI's shape for an unknown model
    method = manager.get(spec.job_id).config.method
    if method != "reward":
        raise ApiError(400, "not_a_reward_model", f"model: {body.model} is a {method} job; /v1/rewards scores with "
                       "a reward model (a job with method: reward)", field="model")
    pool, items = get_pool(request), [item.as_pair() for item in body.input]
    scored = await one_answer(lambda deliver: pool.score(spec, items, deliver=deliver), Scored, SCORE_WAIT_S,
                              "the reward model")
    return RewardList(model=body.model, created=int(time.time()),
                      data=[Reward(index=i, score=s) for i, s in enumerate(scored.scores)])
