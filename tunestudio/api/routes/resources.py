"""/api/jobs/{id}/resources: what a job's processes used over time (CPU, memory, GPU), as its worker sampled it.

The samples are the job's `resources` events (worker/resources.py), stored with its stream: the page draws them
on a reload and adds the live ones from the event stream after `upto` (the job's last_seq when it loaded).
"""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from tunestudio.api.deps import ManagerDep
from tunestudio.api.schemas import ERRORS
from tunestudio.jobs import INT64_MAX

router = APIRouter(prefix="/api/jobs", tags=["jobs"], responses=ERRORS)


class ResourceSample(BaseModel):
    seq: int = Field(description="Its place in the job's event stream.")
    ts: float = Field(description="When it was taken (Unix seconds).")
    cpu_percent: float = Field(description="The job's processes together, 100 = one core busy.")
    rss_mb: float = Field(description="Their resident memory together, MiB.")
    processes: int = Field(description="How many processes: the worker and its children.")
    gpu_percent: float | None = None
    gpu_memory_mb: float | None = None


class ResourcesOut(BaseModel):
    job_id: str
    samples: list[ResourceSample]


@router.get("/{job_id}/resources", response_model=ResourcesOut)
def job_resources(
    job_id: str,
    manager: ManagerDep,
    upto: Annotated[int | None, Query(ge=0, le=INT64_MAX, description="Only samples up to this seq (a job's "
                                                                      "last_seq: the stream goes on after it).")]
    = None,
    limit: Annotated[int, Query(ge=1, le=10_000, description="The newest this many.")] = 10_000,
) -> ResourcesOut:
    """The job's resource samples, oldest first: CPU utilisation and resident memory of its worker and the
    worker's children and, when it uses CUDA, GPU utilisation and memory."""
    samples = []
    for event in manager.resources(job_id, upto, limit):
        data = json.loads(event.text)
        fields = {k: v for k, v in data.items() if k in ResourceSample.model_fields}
        samples.append(ResourceSample(**{**fields, "seq": event.seq}))
    return ResourcesOut(job_id=job_id, samples=samples)
