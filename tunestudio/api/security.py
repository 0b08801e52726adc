"""Who may call the API, how big a request may be, and where its paths may point."""

from __future__ import annotations

import hmac
import ipaddress
from pathlib import Path

from starlette.types import ASGIApp, Receive, Scope, Send

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


def _inside(path: Path, roots: list[Path]) -> bool:
    return any(path == root or path.is_relative_to(root) for root in roots)


def confine_paths(config: JobConfig, settings: Settings) -> None:
    """Datasets inside the allowed roots, output inside the data directory (symlinks resolved)."""
    roots = settings.allowed_dataset_roots()
    for raw in config.local_datasets:
        real = Path(raw).resolve(strict=False)
        if not _inside(real, roots):
            raise ApiError(422, "path_not_allowed",
                           f"local_datasets: {raw} is outside the allowed dataset folders "
                           f"({', '.join(map(str, roots))})", field="local_datasets")
    data_dir = settings.data_dir()
    for name in ("output_dir", "resume_from_checkpoint", "tensorboard_dir"):
        raw = getattr(config, name)
        if name == "tensorboard_dir" and (not config.enable_tensorboard or not Path(raw).is_absolute()):
            continue  # a relative folder lands inside output_dir, which is checked
        if raw and raw != "latest" and not _inside(Path(raw).resolve(strict=False), [data_dir]):
            raise ApiError(422, "path_not_allowed", f"{name}: {raw} is outside the data directory {data_dir}",
                           field=name)


class BodyLimit:
    """ASGI middleware: 413 for a request body over `limit` bytes, declared or streamed."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await _too_large(send, self.limit)
            return
        seen = 0

        async def limited() -> dict:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge()
            return message

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await _too_large(send, self.limit)


class _TooLarge(Exception):
    pass


async def _too_large(send: Send, limit: int) -> None:
    import json

    body = json.dumps({"detail": {"code": "too_large", "message": f"request body over {limit} bytes"}}).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
