"""/api/data/*: making data from documents with a teacher model (issue 43), the API's face of `tunestudio data make`.

The body is a `Recipe` (make_data_config.py): the fields a recipe file has, validated before anything runs, a
refusal a 422 naming the field. It has no key field: a key is never accepted in a request nor returned; the recipe
names the variable that holds it (teacher.api_key_env), which this server reads from its own environment
(`with_key`). Paths are confined to the allowed roots (sources and gates.against readable, output writable), then
resolved and checked as the CLI's are (a source missing, an output file the studio did not write).

POST /make queues a job of kind make_data (listed, watched, stopped and cancelled like any job, its progress the
rows made). POST /preview makes the recipe's first rows in a child process (make_data_preview.py: documents are
never read and the teacher never asked in this one), at most MAX_PREVIEWS at a time, and writes nothing.
"""

from __future__ import annotations

import threading
from typing import Annotated, Any

from fastapi import APIRouter, Header
from pydantic import BaseModel, ConfigDict, Field

from tunestudio.api.deps import ManagerDep, SettingsDep
from tunestudio.api.errors import ApiError
from tunestudio.api.schemas import ERRORS, JobOut
from tunestudio.make_data_config import MakeDataConfig, Recipe, confine, resolve, with_key
from tunestudio.make_data_preview import PreviewFailed, make_preview
from tunestudio.settings import Settings

router = APIRouter(prefix="/api/data", tags=["make data"], responses={
    **ERRORS, 429: {"description": "The queue is full, or MAX_PREVIEWS previews are running"},
    504: {"description": "The preview took longer than PREVIEW_LIMIT_S"}})

MAX_PREVIEWS = 2  # previews at once: each is a child process asking the teacher
PREVIEW_LIMIT_S = 300.0  # a preview's child is killed past this
MAX_PREVIEW_ROWS = 20
_previews = threading.BoundedSemaphore(MAX_PREVIEWS)


class PreviewRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    recipe: Recipe
    rows: int = Field(default=3, ge=1, le=MAX_PREVIEW_ROWS, description="How many rows to ask the teacher for.")


class RemovedRow(BaseModel):
    removed_by: str = Field(description="The gate that removed the row (parse, answer_length, duplicate, ...).")
    key: str = Field(description="The row's source and index (file/chunk/variant).")
    why: str
    text: str = Field(description="What the teacher wrote (500 characters at most).")


class PreviewOut(BaseModel):
    rows: list[dict[str, Any]] = Field(description="Rows every gate kept: {messages, provenance}, as the file's.")
    removed: list[RemovedRow] = Field(description="Rows a gate removed, and why.")


def _config(recipe: Recipe, settings: Settings) -> MakeDataConfig:
    """The recipe confined to the allowed roots, resolved, with its key read here (PathRefused: a 422)."""
    confine(recipe, settings.roots())
    return with_key(resolve(MakeDataConfig.model_validate(recipe.model_dump())))


@router.post("/make", status_code=201, response_model=JobOut)
def make_data(
    recipe: Recipe,
    manager: ManagerDep,
    settings: SettingsDep,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> JobOut:
    """Queue a data-making job (kind "make_data"): documents (or seed prompts) and a teacher write `output`, rows
    appended as they come; a file this studio wrote is appended to (a resume), one it did not is refused."""
    return JobOut.of(manager.make_data(_config(recipe, settings), request_id=idempotency_key))


@router.post("/preview", response_model=PreviewOut)
def preview(body: PreviewRequest, settings: SettingsDep) -> PreviewOut:
    """The recipe's first `rows` rows, made in a child process and written nowhere: those the gates kept and
    those they removed, with the reason."""
    cfg = _config(body.recipe, settings)
    if not _previews.acquire(blocking=False):
        raise ApiError(429, "busy", f"{MAX_PREVIEWS} previews are running; try again when one ends")
    try:
        answer = make_preview(cfg, body.rows, limit_s=PREVIEW_LIMIT_S)
    except PreviewFailed as exc:
        raise ApiError(504 if exc.code == "timeout" else 422, exc.code, str(exc)) from None
    finally:
        _previews.release()
    return PreviewOut(rows=answer["rows"], removed=[RemovedRow.model_validate(r) for r in answer["removed"]])
