"""Who may call the API, how big a request may be, and where its paths may point.

The server is local, so the threats are web pages the user happens to open:
- DNS rebinding (evil.example resolving to 127.0.0.1): refused by the Host check.
- Cross-site form posts (text/plain, urlencoded, multipart need no CORS preflight):
  refused because a state-changing request must be application/json (which a
  foreign page can only send after a preflight this server never answers) and
  must not carry a foreign Origin or Referer.
- Framing (clickjacking) and content sniffing: refused by response headers.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import re
import socket
from urllib.parse import urlsplit

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tunestudio import paths
from tunestudio.api.errors import ApiError, is_openai_path, openai_error_body
from tunestudio.config import JobConfig
from tunestudio.export_config import ExportOptions
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
    expected = settings.api_token.get_secret_value().strip()
    given = given.strip()
    # Settings refuse a blank token; this guard keeps an empty bearer from ever matching one anyway.
    if not expected or not given:
        return False
    return scheme.lower() == "bearer" and hmac.compare_digest(given.encode(), expected.encode())


# Routes that may carry the token as `?access_token=`: EventSource cannot set headers. Anywhere else a
# token in the URL would end up in logs and browser history, so it is not accepted there.
EVENT_STREAM_ROUTES = frozenset({"/api/jobs/{job_id}/events", "/api/train/progress"})

# A state-changing request must be JSON. Routes listed here (path prefixes) may also take a
# multipart/form-data body (file uploads). A cross-site form can post multipart without a preflight, so
# on these routes only the Origin/Referer check stands between a foreign page and the route: browsers
# send Origin on every cross-origin POST. Add a route only when it really takes uploads.
# the page's uploads, OpenAI's Files API, OpenAI's transcriptions (a recording)
MULTIPART_ROUTES: tuple[str, ...] = ("/api/uploads", "/v1/files", "/v1/audio/transcriptions")
# Multipart uploads taken with no Origin (nor Referer) at all: OpenAI's SDKs send none, and a browser's form
# on another site always sends its Origin, which is still checked above.
NO_ORIGIN_MULTIPART = frozenset({"/v1/files", "/v1/audio/transcriptions"})
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
SECURITY_HEADERS = ((b"x-frame-options", b"DENY"), (b"x-content-type-options", b"nosniff"))
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
WILDCARD_BINDS = frozenset({"0.0.0.0", "::", ""})


def split_host(value: str) -> tuple[str, int | None] | None:
    """("name", port) from a Host header or authority ("[::1]:8765" → ("::1", 8765)); None if malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[1:end], value[end + 1:]
    elif value.count(":") > 1:  # a bare IPv6 address: no port can follow it
        name, rest = value, ""
    else:
        name, sep, port = value.partition(":")
        rest = sep + port
    if rest and not (rest.startswith(":") and rest[1:].isdigit() and len(rest) <= 6):
        return None
    if not name:
        return None
    return name.rstrip("."), int(rest[1:]) if rest else None


def allowed_hosts(settings: Settings) -> frozenset[str] | None:
    """Host names this server answers to; None when TUNESTUDIO_ALLOWED_HOSTS holds "*" (check off).

    Any port is accepted on these names: a rebinding page's Host names its own domain, whatever the port.
    """
    extra = [h.strip() for h in settings.allowed_hosts if h.strip()]
    if "*" in extra:
        return None
    names = set(LOOPBACK_NAMES)
    bound = settings.host.strip().strip("[]").lower()
    if bound in WILDCARD_BINDS:
        names.add(socket.gethostname().lower())
    else:
        names.add(bound)
    for entry in extra:
        parsed = split_host(entry)
        if parsed:
            names.add(parsed[0])
    return frozenset(names)


def _origin_authority(origin: str) -> tuple[str, int | None] | None:
    """(name, port) of an Origin or Referer, default ports dropped; None when it is "null" or malformed."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    return parts.hostname.rstrip("."), None if port in (None, 80, 443) else port


def _same_origin(origin: str, host: str) -> bool:
    theirs, ours = _origin_authority(origin), split_host(host)
    if theirs is None or ours is None:
        return False
    name, port = ours
    return theirs == (name, None if port in (None, 80, 443) else port)


class RequestGuard:
    """ASGI middleware, outermost: the Host check, the same-origin JSON rule, and security headers.

    Every response (static files, errors, the 413 of BodyLimit) gets X-Frame-Options and
    X-Content-Type-Options.
    """

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.hosts = allowed_hosts(settings)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []),
                                      *(h for h in SECURITY_HEADERS if h[0] not in present)]
            await send(message)

        refusal = self.refusal(scope)
        if refusal is not None:
            status, code, text = refusal
            await send_error(with_headers, status, code, text, scope.get("path", ""))
            return
        await self.app(scope, receive, with_headers)

    def refusal(self, scope: Scope) -> tuple[int, str, str] | None:
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        host = headers.get("host", "")
        parsed = split_host(host)
        if parsed is None or (self.hosts is not None and parsed[0] not in self.hosts):
            return 400, "bad_host", ("this server does not answer to that Host; add the name to "
                                     "TUNESTUDIO_ALLOWED_HOSTS if it is yours")
        if scope["method"] not in STATE_CHANGING:
            return None
        origin = headers.get("origin") or headers.get("referer")
        if origin is not None and not _same_origin(origin, host):
            return 403, "cross_origin", "a request that changes state must come from this server's own origin"
        media = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media == "application/json":
            return None
        if media == "multipart/form-data" and scope["path"].startswith(MULTIPART_ROUTES) and (
                origin is not None or scope["path"] in NO_ORIGIN_MULTIPART):
            # A form on another site can post multipart without a preflight: only with this server's own
            # Origin (or Referer), which the page's fetch always sends, is it taken; or, on OpenAI's upload
            # route, with none (a programme, not a browser).
            return None
        return 403, "json_required", ("a request that changes state must send 'Content-Type: application/json' "
                                      "(a body of {} where there is nothing to say)")


def confine_paths(config: JobConfig, settings: Settings) -> None:
    """Every path the job touches inside the allowed roots (tunestudio.paths.confine), as a 422 naming the field."""
    try:
        paths.confine(config, settings.roots())
    except paths.PathRefused as exc:
        raise ApiError(422, exc.code, str(exc), field=exc.field,
                       errors=[{"field": exc.field, "message": exc.message}]) from None


def confine_export(options: ExportOptions, settings: Settings) -> None:
    """An export's output folder inside the allowed roots, and its checkpoint a folder name inside the job's output."""
    try:
        paths.confine_output(options.output_dir, settings.roots())
        if options.checkpoint and not re.fullmatch(r"checkpoint-\d{1,12}", options.checkpoint):
            # a name, never a path ("~", "~user", "../x"): the answer must not depend on what exists elsewhere
            raise paths.PathRefused("checkpoint", f"{options.checkpoint!r} must be the name of a checkpoint "
                                                  "folder inside the job's output folder (e.g. checkpoint-40)")
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
            await _too_large(send, limit, scope)
            return
        seen = 0

        async def limited() -> dict:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise _TooLarge(limit)
            return message

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await _too_large(send, limit, scope)


class _TooLarge(HTTPException):
    """Raised while the body is read. An HTTPException: FastAPI lets one through its body parsing (anything else
    there becomes 400 "error parsing the body"), so a streamed (chunked) body over the limit is a 413 as well."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body over {limit} bytes")


async def _too_large(send: Send, limit: int, scope: Scope) -> None:
    await send_error(send, 413, "too_large", f"request body over {limit} bytes", scope.get("path", ""))


async def send_error(send: Send, status: int, code: str, message: str, path: str = "") -> None:
    """An error answer in the API's shape (OpenAI's under /v1), straight from middleware."""
    shape = (openai_error_body(status, message, code) if is_openai_path(path)
             else {"detail": {"code": code, "message": message}})
    body = json.dumps(shape).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
