"""/api/system (behind the token, like every /api route) and /healthz (open)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from tunestudio.api.hardware import hardware

router = APIRouter(prefix="/api/system", tags=["system"])
health = APIRouter(tags=["system"])


@router.get("/hardware")
def system_hardware() -> dict[str, Any]:
    """CPU, memory and GPUs (nvidia-smi or NVML), read without importing torch."""
    return hardware()


@health.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}
