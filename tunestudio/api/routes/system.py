"""/api/system (behind the token, like every /api route) and /healthz (open)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel

from tunestudio.api.hardware import hardware
from tunestudio.kinds import KINDS

router = APIRouter(prefix="/api/system", tags=["system"])
health = APIRouter(tags=["system"])


@router.get("/hardware")
def system_hardware() -> dict[str, Any]:
    """CPU, memory and GPUs (nvidia-smi or NVML), read without importing torch."""
    return hardware()


class KindOut(BaseModel):
    name: str
    label: str
    trains: bool
    distributed: bool


@router.get("/kinds")
def system_kinds() -> list[KindOut]:
    """The kinds of job (tunestudio.kinds): what each is, as the page and clients read it."""
    return [KindOut(name=s.name, label=s.label, trains=s.trains, distributed=s.distributed) for s in KINDS.values()]


@health.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}
