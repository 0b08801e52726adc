"""Errors of the OpenAI-shaped routes (/v1 and the fine-tuning API): `{"error": {"message", "type", "param",
"code"}}` with OpenAI's statuses, for every error a route, its dependencies or its body raise.

Below the routes (api/routes/openai.py, completions.py, fine_tuning's routes) and beside api/fine_tuning.py,
which all use it: a module of api/ never imports one of api/routes/ (tests/test_layers.py).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from tunestudio.api.errors import ApiError, openai_error_body, request_field_errors
from tunestudio.inference import InferenceUnavailable, UnknownModel

__all__ = ["OpenAIRoute", "error_response"]


def error_response(status: int, message: str, code: str | None, param: str | None = None) -> JSONResponse:
    return JSONResponse(openai_error_body(status, message, code, param), status_code=status)


class OpenAIRoute(APIRoute):
    """Every error of a /v1 route in OpenAI's shape: its dependencies' (the token) and its body's included."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                errors = request_field_errors(exc, request)
                summary = "; ".join(f"{e['field'] or 'request'}: {e['message']}" for e in errors)
                return error_response(400, summary, "invalid_request", errors[0]["field"] if errors else None)
            except ApiError as exc:
                return error_response(exc.status, exc.message, exc.code, exc.extra.get("field"))
            except UnknownModel as exc:  # 404, or 409 for a job whose weights another job replaced
                return error_response(exc.status, str(exc), exc.code, "model")
            except InferenceUnavailable as exc:
                return error_response(exc.status, str(exc), exc.code, exc.extra.get("param"))
            except StarletteHTTPException as exc:
                return error_response(exc.status_code, str(exc.detail), "http_error")

        return handle
