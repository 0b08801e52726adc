"""Sweeps: create, list, get (the leaderboard), stop, resume, delete. Thin: `sweeps.Sweeps` does the work."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel, ConfigDict, SecretStr

from tunestudio import paths
from tunestudio.api.deps import SettingsDep
from tunestudio.api.errors import ApiError
from tunestudio.api.schemas import ERRORS
from tunestudio.sweeps import (
    SecretRefused,
    SecretsNeeded,
    SweepConfig,
    SweepConflict,
    SweepList,
    SweepNotFound,
    Sweeps,
    SweepView,
)

router = APIRouter(prefix="/api/sweeps", tags=["sweeps"], responses=ERRORS)


def get_sweeps(request: Request) -> Sweeps:
    return request.app.state.sweeps


SweepsDep = Annotated[Sweeps, Depends(get_sweeps)]


class SweepSecrets(BaseModel):
    """The secrets a sweep's base set, given again: they are kept in memory only, so a restarted server's sweep
    needs them before its next trial."""

    model_config = ConfigDict(extra="forbid")

    hf_token: SecretStr | None = None
    wandb_token: SecretStr | None = None

    def given(self) -> dict[str, SecretStr]:
        return {name: value for name, value in (("hf_token", self.hf_token), ("wandb_token", self.wandb_token))
                if value is not None}


def _answer(call: Any, *args: Any) -> Any:
    try:
        return call(*args)
    except SweepNotFound as exc:
        raise ApiError(404, "not_found", str(exc)) from None
    except SecretsNeeded as exc:
        raise ApiError(422, "secret_needed", str(exc), field=exc.fields[0],
                       errors=[{"field": name, "message": str(exc)} for name in exc.fields]) from None
    except SecretRefused as exc:
        raise ApiError(422, "invalid_request", str(exc), field=exc.field,
                       errors=[{"field": exc.field, "message": str(exc).split(": ", 1)[1]}]) from None
    except SweepConflict as exc:
        raise ApiError(409, "conflict", str(exc)) from None


@router.post("", status_code=201)
def create_sweep(config: SweepConfig, sweeps: SweepsDep, settings: SettingsDep) -> SweepView:
    """Start a sweep: its trials are jobs of the queue. A bad space or base, or a path of the base or of any value
    of the space outside the allowed roots, is a 422 naming the field (space.<field> for a swept one)."""
    try:
        config.confine(settings.roots())
    except paths.PathRefused as exc:
        raise ApiError(422, exc.code, str(exc), field=exc.field,
                       errors=[{"field": exc.field, "message": exc.message}]) from None
    return sweeps.create(config, confined=True)


@router.get("")
def list_sweeps(sweeps: SweepsDep) -> SweepList:
    """Every sweep, newest first, each with its ranked trials."""
    return SweepList(items=sweeps.list())


@router.get("/{sweep_id}")
def get_sweep(sweep_id: str, sweeps: SweepsDep) -> SweepView:
    """{id, status, objective, trials (ranked by the objective), best}."""
    return _answer(sweeps.get, sweep_id)


@router.post("/{sweep_id}/stop")
def stop_sweep(sweep_id: str, sweeps: SweepsDep) -> SweepView:
    """No new trials; the running ones stop with a save."""
    return _answer(sweeps.stop, sweep_id)


@router.post("/{sweep_id}/resume")
def resume_sweep(sweep_id: str, body: SweepSecrets, sweeps: SweepsDep) -> SweepView:
    """Give a sweep its secrets again (a restarted server's sweep, `status` needs_secrets): it goes on. A 422 names
    a secret its base set that is missing here, or one it never set; a 409 when it needs none."""
    return _answer(sweeps.resume, sweep_id, body.given())


@router.delete("/{sweep_id}", status_code=204)
def delete_sweep(sweep_id: str, sweeps: SweepsDep) -> Response:
    """Forget a finished sweep; its trials stay, as the jobs they are."""
    _answer(sweeps.delete, sweep_id)
    return Response(status_code=204)
