"""Dependencies for routes, as `Annotated` aliases."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from tunestudio.api.errors import ApiError
from tunestudio.api.security import EVENT_STREAM_ROUTES, token_ok
from tunestudio.jobs import JobManager
from tunestudio.settings import Settings


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_manager(request: Request) -> JobManager:
    return request.app.state.manager


def require_token(request: Request) -> None:
    settings: Settings = request.app.state.settings
    authorization = request.headers.get("authorization")
    route = request.scope.get("route")
    if (authorization is None and "access_token" in request.query_params
            and getattr(route, "path", None) in EVENT_STREAM_ROUTES):
        # EventSource cannot set headers: event streams (only) may carry the token in the query.
        authorization = f"Bearer {request.query_params['access_token']}"
    if not token_ok(settings, authorization):
        raise ApiError(401, "unauthorized", "this server needs 'Authorization: Bearer <token>'")


SettingsDep = Annotated[Settings, Depends(get_settings)]
ManagerDep = Annotated[JobManager, Depends(get_manager)]
