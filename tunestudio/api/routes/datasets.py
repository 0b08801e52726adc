"""/api/datasets/*: the dataset report (`tunestudio.data_report`), the same object `tunestudio data inspect
--json` prints.

Local files only (a hub dataset would be downloaded to be read; the job reads it when it starts). The files
and the model folder are confined to the allowed roots and resolved as a job's are, so what a job would
refuse is a 422 here too.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from tunestudio import paths
from tunestudio.api.deps import SettingsDep
from tunestudio.api.errors import ApiError
from tunestudio.api.security import confine_paths
from tunestudio.config import JobConfig, format_validation_error
from tunestudio.data_report import ReportError, ReportRequest, run_report_async
from tunestudio.settings import Settings

router = APIRouter(prefix="/api/datasets", tags=["datasets"])

# ReportError's code → the answer's status: a report that cannot be made is the dataset's fault (422), unless it
# waited for its turn (429), ran out of time (504) or memory (413).
STATUS = {"dataset_error": 422, "busy": 429, "timeout": 504, "too_large": 413}


@router.post("/report")
async def report(settings: SettingsDep, body: Annotated[ReportRequest, Body()]) -> dict[str, Any]:
    """Rows read and refused (file, line, reason), the format, exact and near duplicates, token lengths with the
    model's tokenizer (histogram, rows and tokens cut at max_seq_length, keep_95/keep_99), the eval rows' overlap
    with the training rows, per-column and per-role counts. Computed in a child process, one at a time."""
    config = await run_in_threadpool(_config, settings, body)  # it asks the filesystem
    try:
        return await run_report_async(config, tokenize=body.model_name is not None, dedupe=body.dedupe)
    except ReportError as exc:
        raise ApiError(STATUS.get(exc.code, 422), exc.code, str(exc)) from None


def _config(settings: Settings, body: ReportRequest) -> JobConfig:
    try:
        config = body.job_config()
    except ValidationError as exc:
        errors = format_validation_error(exc)
        raise ApiError(422, "invalid_request", "; ".join(f"{e['field'] or 'request'}: {e['message']}"
                                                         for e in errors), errors=errors) from None
    confine_paths(config, settings)
    return paths.resolve(config)  # a missing file is a 422 naming the field (api/errors.py)
