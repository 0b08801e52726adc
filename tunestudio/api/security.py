"""Who may call the API, how big a request may be, and where its paths may point."""

from __future__ import annotations

import hmac
import ipaddress

from starlette.types import ASGIApp, Receive, Scope, Send

from tunestudio import paths
from tunestudio.api.errors import ApiError
from tunestudio.config import JobConfig
from tunestudio.settings import Settings


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(settings: Settings, host: str) -> None:
    """Refuse to serve beyond this machine without a token."""
    if not is_loopback(host) and settings.api_token is None:
        raise SystemExit(
            f"refusing to bind to {host}: serving beyond loopback needs an API token "
            "(set TUNESTUDIO_API_TOKEN)"
        )


def token_ok(settings: Settings, authorization: str | None) -> bool:
    if settings.api_token is None:
        return True
    scheme, _, given = (authorization or "").partition(" ")
    expected = settings.api_token.get_secret_value()
    return scheme.lower() == "bearer" and hmac.compare_digest(given.encode(), expected.encode())


def confine_paths(config: JobConfig, settings: Settings) -> None:
    """Every path the job touches inside the allowed roots (tunestudio.paths.confine), as a 422 naming the field."""
    try:
        paths.confine(config, settings.roots())
    except paths.PathRefused as exc:
        raise ApiError(422, exc.code, str(exc), field=exc.field,
                       errors=[{"field": exc.field, "message": exc.message}]) from None


class BodyLimit:
    """ASGI middleware: 413 for a request body over `limit` bytes, declared or streamed.

    `per_path` gives an exact path a limit of its own (the dataset upload route takes files).
    """

    def __init__(self, app: ASGIApp, limit: int, per_path: dict[str, int] | None = None) -> None:
        self.app, self.default_limit, self.per_path = app, limit, per_path or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.per_path.get(scope.get("path", ""), self.default_limit)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await _too_large(send, limit)
            return
        seen = 0

        async def limited() -> dict:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise _TooLarge()
            return message

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await _too_large(send, limit)


class _TooLarge(Exception):
    pass


async def _too_large(send: Send, limit: int) -> None:
    import json

    body = json.dumps({"detail": {"code": "too_large", "message": f"request body over {limit} bytes"}}).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
