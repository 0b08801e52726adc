"""Every error answer is {"detail": {"code", "message", ...}}, without internals.

Under /v1 (OpenAI's API shape) it is {"error": {"message", "type", "param", "code"}} instead: the routes'
own errors (api/routes/openai.py), and those of the middleware and of routing (a 413, a refused Host or
Origin, an unknown path), so OpenAI's clients read every one.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from tunestudio.bench_tasks import UnknownTasks
from tunestudio.config import field_errors
from tunestudio.jobs import JobConflict, JobNotFound, QueueFull, StoreUnavailable
from tunestudio.paths import PathRefused

log = logging.getLogger(__name__)


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.extra = status, code, message, extra


def error_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"detail": {"code": code, "message": message, **extra}}


def is_openai_path(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/")


def openai_error_body(status: int, message: str, code: str | None, param: str | None = None) -> dict[str, Any]:
    """An error in OpenAI's shape; `type` as OpenAI puts it for the status."""
    kind = ("invalid_request_error" if status in (400, 404, 405, 409, 413, 422)
            else "authentication_error" if status == 401 else "permission_error" if status == 403
            else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def body_model(request: Request | None) -> type[BaseModel] | None:
    """The model the request's route reads its body as (FastAPI's own, of several body parameters), if any."""
    field = getattr(request.scope.get("route"), "body_field", None) if request is not None else None
    annotation = getattr(getattr(field, "field_info", None), "annotation", None)
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def request_field_errors(exc: RequestValidationError, request: Request | None = None) -> list[dict[str, str]]:
    """[{field, message}] with the body prefix dropped: the field is named as the user wrote it (and an unknown
    field of the request's body gets the closest name its model has)."""
    return field_errors(({**item, "loc": [p for p in item.get("loc", ()) if p != "body"]} for item in exc.errors()),
                        body_model(request))


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(error_body(exc.code, exc.message, **exc.extra), status_code=exc.status)

    @app.exception_handler(JobNotFound)
    async def _not_found(request: Request, exc: JobNotFound) -> JSONResponse:
        return JSONResponse(error_body("not_found", str(exc)), status_code=404)

    @app.exception_handler(JobConflict)
    async def _conflict(request: Request, exc: JobConflict) -> JSONResponse:
        extra = {"exports": exc.exports} if exc.exports is not None else {}
        return JSONResponse(error_body("conflict", str(exc), **extra), status_code=409)

    @app.exception_handler(PathRefused)
    async def _path(request: Request, exc: PathRefused) -> JSONResponse:
        errors = [{"field": field, "message": exc.message} for field in exc.fields]
        return JSONResponse(error_body(exc.code, str(exc), field=exc.field, errors=errors), status_code=422)

    @app.exception_handler(UnknownTasks)
    async def _tasks(request: Request, exc: UnknownTasks) -> JSONResponse:
        errors = [{"field": exc.field, "message": message} for message in exc.messages]
        return JSONResponse(error_body("invalid_request", str(exc), field=exc.field, errors=errors), status_code=422)

    @app.exception_handler(QueueFull)
    async def _queue_full(request: Request, exc: QueueFull) -> JSONResponse:
        return JSONResponse(error_body("queue_full", str(exc)), status_code=429)

    @app.exception_handler(StoreUnavailable)
    async def _store(request: Request, exc: StoreUnavailable) -> JSONResponse:
        return JSONResponse(error_body("store_unavailable", str(exc), reason=exc.reason), status_code=503,
                            headers={"Retry-After": "5"})

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = request_field_errors(exc, request)
        summary = "; ".join(f"{e['field'] or 'request'}: {e['message']}" for e in errors)
        return JSONResponse(error_body("invalid_request", summary, errors=errors), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed", 401: "unauthorized", 413: "too_large"}.get(
            exc.status_code, "http_error"
        )
        body = (openai_error_body(exc.status_code, str(exc.detail), code) if is_openai_path(request.url.path)
                else error_body(code, str(exc.detail)))
        return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        # Starlette sends this answer from outside every middleware, so it carries the security headers itself.
        message = "internal error; see the server log"
        body = (openai_error_body(500, message, "internal_error") if is_openai_path(request.url.path)
                else error_body("internal_error", message))
        return JSONResponse(body, status_code=500,
                            headers={"X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff"})
