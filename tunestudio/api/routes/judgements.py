"""Judgements: a pairwise judge of a job's model against its base or another job (tunestudio/judge/).

POST /api/jobs/{id}/judgements starts one (202; it runs in the background, its rows appear as they are
judged), GET /api/jobs/{id}/judgements lists a job's, GET /api/judgements/{jid} reads one with every row,
POST /api/judgements/{jid}/cancel ends a running one (409 for one that has ended).
The judge is the endpoint the environment names (TUNESTUDIO_JUDGE_URL, TUNESTUDIO_JUDGE_MODEL, its deadline
TUNESTUDIO_JUDGE_DEADLINE_S, its key); the key is never stored or shown.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from tunestudio.api.deps import ManagerDep, SettingsDep
from tunestudio.api.errors import ApiError
from tunestudio.api.judging import MAX_ANSWER_TOKENS
from tunestudio.api.schemas import ERRORS
from tunestudio.inference import UnknownModel, resolve
from tunestudio.judge import (
    MAX_PROMPTS,
    Endpoint,
    JudgementOver,
    Judgements,
    JudgeNotConfigured,
    PromptsError,
    UnknownJudgement,
    held_out_prompts,
    read_prompts,
)
from tunestudio.judge import Prompt as JudgedPrompt
from tunestudio.paths import expand

router = APIRouter(tags=["judgements"], responses=ERRORS)

Prompt = Annotated[str, Field(min_length=1, max_length=20_000)]


class JudgementRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    against: str = Field(default="base", min_length=1, max_length=200,
                         description='"base" (the job\'s base model) or the id of another job.')
    prompts: list[Prompt] | None = Field(default=None, min_length=1, max_length=MAX_PROMPTS,
                                         description="The prompts to judge on; default: the job's held-out rows.")
    prompts_file: str | None = Field(default=None, max_length=4096,
                                     description="A prompt file (.txt, .jsonl, .json) inside the dataset folders.")
    limit: int | None = Field(default=None, ge=1, le=MAX_PROMPTS, description="At most this many.")
    max_tokens: int = Field(default=MAX_ANSWER_TOKENS, ge=1, le=4096, description="Each model's answer, at most.")


def get_judgements(request: Request) -> Judgements:
    return request.app.state.judgements


JudgementsDep = Annotated[Judgements, Depends(get_judgements)]


def _prompts(body: JudgementRequest, job_result: dict[str, Any] | None,
             settings: SettingsDep) -> tuple[list[JudgedPrompt], str]:
    if body.prompts is not None and body.prompts_file is not None:
        raise ApiError(422, "invalid_request", "prompts_file: give prompts or prompts_file, not both",
                       field="prompts_file")
    if body.prompts is not None:
        found, source = list(body.prompts), "the request's prompts"
    elif body.prompts_file is not None:
        try:
            path = expand(body.prompts_file).resolve()
        except (OSError, ValueError) as exc:  # a NUL byte, a name the system refuses
            raise ApiError(422, "invalid_request", f"prompts_file: not a usable path ({exc})",
                           field="prompts_file") from None
        if not any(path.is_relative_to(root) for root in settings.allowed_dataset_roots()):
            raise ApiError(422, "path_not_allowed", f"prompts_file: {body.prompts_file!r} is outside the dataset "
                           "folders (TUNESTUDIO_DATASET_ROOTS)", field="prompts_file")
        try:
            found, source = read_prompts(path), str(path)
        except PromptsError as exc:
            raise ApiError(422, "invalid_request", f"prompts_file: {exc}", field="prompts_file") from None
    else:
        found, source = held_out_prompts(job_result), "the job's held-out rows"
        if not found:
            raise ApiError(409, "conflict", "the job has no held-out rows answered by its evaluation; give prompts "
                           "or prompts_file", field="prompts")
    return (found[: body.limit] if body.limit else found), source


@router.post("/api/jobs/{job_id}/judgements", status_code=202)
def start_judgement(job_id: str, body: JudgementRequest, manager: ManagerDep, settings: SettingsDep,
                    judgements: JudgementsDep) -> dict[str, Any]:
    """Both models answer each prompt (greedy), and the judge compares each pair in both orders."""
    job = manager.get(job_id)
    against = f"{job_id}:base" if body.against == "base" else body.against
    for model_id, field in ((job_id, "job"), (against, "against")):
        try:
            resolve(manager, model_id)
        except UnknownModel as exc:
            raise ApiError(409, "conflict", f"{field}: {exc}", field=field) from None
    if against == job_id:
        raise ApiError(422, "invalid_request", "against: a job is not judged against itself", field="against")
    prompts, source = _prompts(body, job.result, settings)
    try:
        endpoint = Endpoint.from_env()
    except JudgeNotConfigured as exc:
        raise ApiError(422, "invalid_request", f"judge: {exc}", field="judge") from None
    return judgements.start(job_id, job_id, against, prompts, endpoint.cancellable, endpoint.describe(), source,
                            max_tokens=body.max_tokens)


@router.get("/api/jobs/{job_id}/judgements")
def list_judgements(job_id: str, manager: ManagerDep, judgements: JudgementsDep) -> list[dict[str, Any]]:
    manager.get(job_id)  # 404 for an unknown job
    return judgements.list(job_id)


@router.get("/api/judgements/{judgement_id}")
def get_judgement(judgement_id: str, judgements: JudgementsDep) -> dict[str, Any]:
    try:
        return judgements.get(judgement_id)
    except UnknownJudgement:
        raise ApiError(404, "not_found", f"judgement {judgement_id} does not exist") from None


@router.post("/api/judgements/{judgement_id}/cancel")
def cancel_judgement(judgement_id: str, judgements: JudgementsDep) -> dict[str, Any]:
    """End a running judgement as cancelled: the calls under way are cut, the rows judged before are kept."""
    try:
        return judgements.cancel(judgement_id)
    except UnknownJudgement:
        raise ApiError(404, "not_found", f"judgement {judgement_id} does not exist") from None
    except JudgementOver as exc:
        raise ApiError(409, "conflict", str(exc)) from None
