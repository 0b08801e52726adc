"""The arena under /api/arena: battles between two models, blind votes, the leaderboard, the votes as datasets.

GET  /api/arena                       the roster, endpoints and progress
PUT  /api/arena/models                the roster: the models battles are drawn from
POST /api/arena/battles               a prompt (or one drawn from a prompt file) answered by two of them (202)
GET  /api/arena/battles/{id}          the battle (blind: no model named until its vote is stored)
POST /api/arena/battles/{id}/vote     a, b, tie or both_bad; the better answer edited if you like
POST /api/arena/undo                  the newest vote taken back
GET  /api/arena/votes                 the stored votes
GET  /api/arena/leaderboard           Bradley-Terry scores, pairwise win rates, position bias, judge agreement
POST /api/arena/judge                 the judge (TUNESTUDIO_JUDGE_*) asked about voted battles it has not seen
GET/POST /api/arena/endpoints, DELETE /api/arena/endpoints/{name}   OpenAI-compatible models (the key's env name)
POST /api/arena/exports               the votes as a new dataset (dpo pairs, kto rows, sft edits)
POST /api/arena/train                 that dataset trained on at once (a DPO, ORPO, KTO, reward or SFT job)
"""

from __future__ import annotations

import random
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tunestudio.api.deps import ManagerDep, SettingsDep
from tunestudio.api.errors import ApiError
from tunestudio.api.schemas import ERRORS
from tunestudio.api.security import confine_paths
from tunestudio.arena import Arena, ArenaInvalid, Params, UnknownBattle, VoteRefused
from tunestudio.config import JobConfig, format_validation_error
from tunestudio.judge import Endpoint, JudgeNotConfigured, PromptsError, read_prompts
from tunestudio.paths import expand

router = APIRouter(prefix="/api/arena", tags=["arena"], responses=ERRORS)
Text = Annotated[str, Field(min_length=1, max_length=20_000)]
ModelId = Annotated[str, Field(min_length=1, max_length=300)]


def get_arena(request: Request) -> Arena:
    return request.app.state.arena


ArenaDep = Annotated[Arena, Depends(get_arena)]


def refused(exc: ArenaInvalid) -> ApiError:
    return ApiError(409 if exc.conflict else 422, "conflict" if exc.conflict else "invalid_request", str(exc),
                    field=exc.field)


class Turn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant"]
    content: Text


class BattleRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt: Text | None = Field(default=None, description="One user turn.")
    messages: list[Turn] | None = Field(default=None, min_length=1, max_length=64,
                                        description="A conversation ending with the user's turn.")
    prompts_file: str | None = Field(default=None, max_length=4096,
                                     description="A prompt file (.txt, .jsonl, .json) in the dataset folders: one "
                                                 "of its prompts, drawn at random.")
    models: list[ModelId] | None = Field(default=None, max_length=16, description="Default: the roster.")
    blind: bool = True
    temperature: float = Field(default=0.7, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    max_tokens: int = Field(default=256, ge=1, le=4096)


class VoteRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    choice: Literal["a", "b", "tie", "both_bad"]
    edited: str | None = Field(default=None, max_length=20_000, description="The better answer, edited.")


class RosterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    models: list[ModelId] = Field(max_length=16)


class EndpointRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64)
    url: str = Field(min_length=1, max_length=2000)
    model: str = Field(min_length=1, max_length=300)
    key_env: str | None = Field(default=None, max_length=128,
                                description="The name of the environment variable holding the key (never the key).")


class ExportRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: Literal["dpo", "kto", "sft"] = "dpo"


class TrainRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    from_job: str = Field(min_length=1, max_length=200,
                          description="The job whose model and settings the new job starts from.")
    method: Literal["dpo", "orpo", "kto", "reward", "sft"] = "dpo"
    max_steps: int | None = Field(default=None, ge=1, le=1_000_000)
    learning_rate: float | None = Field(default=None, gt=0, le=1)


class JudgeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    limit: int = Field(default=20, ge=1, le=200)


# What a job trained on the votes keeps of the job it starts from: its model and how it is loaded and adapted.
CARRIED = ("model_name", "training_type", "load_in_4bit", "max_seq_length", "precision", "lora_r", "lora_alpha",
           "lora_dropout", "target_modules", "use_rslora", "gradient_checkpointing", "batch_size",
           "gradient_accumulation_steps", "learning_rate", "random_seed")
EXPORT_OF = {"dpo": "dpo", "orpo": "dpo", "reward": "dpo", "kto": "kto", "sft": "sft"}


@router.get("")
def arena_state(arena: ArenaDep) -> dict[str, Any]:
    return {"roster": arena.roster(), "endpoints": arena.endpoints(), "progress": arena.progress()}


@router.put("/models")
def set_roster(body: RosterRequest, arena: ArenaDep) -> dict[str, Any]:
    try:
        return {"roster": arena.set_roster(body.models)}
    except ArenaInvalid as exc:
        raise refused(exc) from None


@router.post("/battles", status_code=202)
def start_battle(body: BattleRequest, arena: ArenaDep, settings: SettingsDep) -> dict[str, Any]:
    """Two models answer (one after the other); poll the battle until it is ready, then vote."""
    given = [name for name, value in (("prompt", body.prompt), ("messages", body.messages),
                                      ("prompts_file", body.prompts_file)) if value is not None]
    if len(given) != 1:
        raise ApiError(422, "invalid_request", "prompt: give one of prompt, messages or prompts_file",
                       field="prompt")
    source = ""
    if body.prompt is not None:
        messages = [{"role": "user", "content": body.prompt}]
    elif body.messages is not None:
        messages = [t.model_dump() for t in body.messages]
    else:
        messages, source = _drawn(str(body.prompts_file), settings), str(body.prompts_file)
    params = Params(temperature=body.temperature, top_p=body.top_p, max_tokens=body.max_tokens)
    try:
        return arena.start(messages, body.models, blind=body.blind, params=params, source=source)
    except ArenaInvalid as exc:
        raise refused(exc) from None


def _drawn(name: str, settings: Any) -> list[dict[str, Any]]:
    try:
        path = expand(name).resolve()
    except (OSError, ValueError) as exc:  # a NUL byte, a name the system refuses
        raise ApiError(422, "invalid_request", f"prompts_file: not a usable path ({exc})",
                       field="prompts_file") from None
    if not any(path.is_relative_to(root) for root in settings.allowed_dataset_roots()):
        raise ApiError(422, "path_not_allowed", f"prompts_file: {name!r} is outside the dataset folders "
                       "(TUNESTUDIO_DATASET_ROOTS)", field="prompts_file")
    try:
        prompts = read_prompts(path)
    except PromptsError as exc:
        raise ApiError(422, "invalid_request", f"prompts_file: {exc}", field="prompts_file") from None
    prompt = random.SystemRandom().choice(prompts)
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]


@router.get("/battles/{battle_id}")
def get_battle(battle_id: str, arena: ArenaDep) -> dict[str, Any]:
    try:
        return arena.battle(battle_id)
    except UnknownBattle:
        raise ApiError(404, "not_found", f"battle {battle_id} does not exist") from None


@router.post("/battles/{battle_id}/vote")
def vote(battle_id: str, body: VoteRequest, arena: ArenaDep) -> dict[str, Any]:
    """Store the vote; the answer names the two models."""
    try:
        return arena.vote(battle_id, body.choice, body.edited)
    except UnknownBattle:
        raise ApiError(404, "not_found", f"battle {battle_id} does not exist: a vote is for a battle shown") from None
    except VoteRefused as exc:
        raise ApiError(409, "conflict", str(exc), field="battle") from None
    except ArenaInvalid as exc:
        raise refused(exc) from None


@router.post("/undo")
def undo(arena: ArenaDep) -> dict[str, Any]:
    """Take the newest vote back; its battle can be voted on again."""
    try:
        return arena.undo()
    except ArenaInvalid as exc:
        raise refused(exc) from None


@router.get("/votes")
def list_votes(arena: ArenaDep, limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
               offset: Annotated[int, Query(ge=0, le=2**62)] = 0) -> dict[str, Any]:
    return {"votes": arena.votes(limit, offset), "total": arena.progress()["votes"]}


@router.get("/leaderboard")
def get_leaderboard(arena: ArenaDep) -> dict[str, Any]:
    return arena.leaderboard([r["model"] for r in arena.roster()])


@router.post("/judge")
def ask_judge(arena: ArenaDep, body: JudgeRequest | None = None) -> dict[str, Any]:
    """The judge the environment names, asked (both orders) about up to `limit` voted battles it has not seen."""
    try:
        endpoint = Endpoint.from_env()
    except JudgeNotConfigured as exc:
        raise ApiError(422, "invalid_request", f"judge: {exc}", field="judge") from None
    return arena.judge(endpoint, endpoint.describe(), (body or JudgeRequest()).limit)


@router.get("/endpoints")
def list_endpoints(arena: ArenaDep) -> list[dict[str, Any]]:
    return arena.endpoints()


@router.post("/endpoints", status_code=201)
def add_endpoint(body: EndpointRequest, arena: ArenaDep) -> dict[str, Any]:
    """An OpenAI-compatible model as a contender (`endpoint:<name>`); its key is read from `key_env` at each call."""
    try:
        return arena.add_endpoint(body.name, body.url, body.model, body.key_env)
    except ArenaInvalid as exc:
        raise refused(exc) from None


@router.delete("/endpoints/{name}", status_code=204)
def remove_endpoint(name: str, arena: ArenaDep) -> None:
    try:
        arena.remove_endpoint(name)
    except ArenaInvalid as exc:
        raise ApiError(404, "not_found", str(exc), field="name") from None


@router.post("/exports", status_code=201)
def export_votes(body: ExportRequest, arena: ArenaDep) -> dict[str, Any]:
    """The votes as a new JSONL dataset in the data directory's data/arena/ (never over a file)."""
    try:
        return arena.export(body.format)
    except ArenaInvalid as exc:
        raise refused(exc) from None


@router.post("/train", status_code=201)
def train_on_votes(body: TrainRequest, arena: ArenaDep, manager: ManagerDep, settings: SettingsDep) -> dict[str, Any]:
    """Export the votes and queue a job on them, starting from `from_job`'s model and settings; the new job joins
    the roster."""
    source = manager.get(body.from_job)
    if source.kind != "train":
        raise ApiError(422, "invalid_request", f"from_job: {body.from_job} is an {source.kind} job, not a training "
                       "job", field="from_job")
    config = {k: v for k, v in source.config.public_dict().items() if k in CARRIED and v is not None}
    if body.max_steps is not None:
        config["max_steps"] = body.max_steps
    if body.learning_rate is not None:
        config["learning_rate"] = body.learning_rate
    try:
        rows, _ = arena.rows(EXPORT_OF[body.method])
    except ArenaInvalid as exc:
        raise refused(exc) from None
    if not rows:
        raise ApiError(409, "conflict", f"method: no vote makes a {EXPORT_OF[body.method]} row yet", field="method")
    try:  # checked before the file is written: a refused config leaves nothing behind
        JobConfig.model_validate({**config, "method": body.method, "local_datasets": ["/dev/null"]})
    except ValidationError as exc:
        raise ApiError(422, "invalid_config", format_validation_error(exc), field="from_job") from None
    exported = arena.export(EXPORT_OF[body.method])
    job_config = JobConfig.model_validate({**config, "method": body.method, "local_datasets": [exported["path"]]})
    confine_paths(job_config, settings)
    job = manager.submit(job_config)
    arena.join(job.id)
    return {"job": {"id": job.id, "status": job.status}, "dataset": exported}
