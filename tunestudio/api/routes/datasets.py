"""/api/datasets/*: the dataset report (`tunestudio.data_report`), the same object `tunestudio data inspect
--json` prints.

The body is a `ReportSpec` (the job's data fields, validated as a job's: a refusal is a 422 naming the field).
Its local paths (files, an eval file, a model folder, a local `datasets` folder, a held-out record) are
confined to the allowed roots and resolved as a job's are, so what a job would refuse is a 422 here too. A hub
dataset (hf_dataset) is read from the local cache, or downloaded as a job would download it; a hub that
cannot be reached is the job's own message (422).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body
from starlette.concurrency import run_in_threadpool

from tunestudio import paths
from tunestudio.api.deps import SettingsDep
from tunestudio.api.errors import ApiError
from tunestudio.config import ReportSpec
from tunestudio.data_report import ReportError, resolved, run_report_async
from tunestudio.settings import Settings

router = APIRouter(prefix="/api/datasets", tags=["datasets"])

# ReportError's code → the answer's status: a report that cannot be made is the dataset's fault (422), unless it
# waited for its turn (429), ran out of time (504) or memory (413).
STATUS = {"dataset_error": 422, "busy": 429, "timeout": 504, "too_large": 413}


@router.post("/report")
async def report(settings: SettingsDep, body: Annotated[ReportSpec, Body()]) -> dict[str, Any]:
    """Rows read and refused (file, line, reason), the format, exact and near duplicates, token lengths with the
    model's tokenizer (histogram, rows and tokens cut at max_seq_length, keep_95/keep_99), the eval rows' overlap
    with the training rows, per-column and per-role counts. Computed in a child process, one at a time."""
    spec = await run_in_threadpool(_confined, settings, body)  # it asks the filesystem
    try:
        return await run_report_async(spec)
    except ReportError as exc:
        raise ApiError(STATUS.get(exc.code, 422), exc.code, str(exc)) from None


def _confined(settings: Settings, spec: ReportSpec) -> ReportSpec:
    """The spec's paths inside the allowed roots, then resolved (paths.PathRefused: a 422 naming the field)."""
    paths.confine_inputs(spec, settings.roots())
    return resolved(spec)
