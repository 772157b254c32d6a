"""`HttpGuard`: the checks every HTTP request passes before it reaches a route.

In order:
1. `Host` must name this server (`host`, `allowed_hosts`, loopback names): a web page
   whose DNS name was rebound to 127.0.0.1 cannot talk to it through a browser.
2. With an API key, every route but /health needs `Authorization: Bearer <key>` (401).
3. A POST must carry `Content-Type: application/json` (415): a browser sends a
   cross-site "simple" POST (no preflight) only as text/plain, a form, or untyped.
Each refusal is OpenAI error JSON, counted in `sluice_http_errors_total`.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from runtime.api.auth import WILDCARD_HOSTS, is_loopback, key_matches
from runtime.api.openai.protocol import ApiError
from runtime.config.server import ServerConfig

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
OPEN_PATHS = frozenset({"/health"})  # served without the API key


def allowed_hosts(cfg: ServerConfig) -> frozenset[str] | None:
    """The names a request's Host may give; None: any."""
    names = {h.strip().lower().rstrip(".") for h in cfg.allowed_hosts.split(",") if h.strip()}
    wildcard = cfg.host in WILDCARD_HOSTS
    if "*" in names or (wildcard and not names):
        return None
    names.add(cfg.host.lower().strip("[]"))
    if wildcard or is_loopback(cfg.host):
        names |= LOOPBACK_NAMES
    return frozenset(names)


def host_name(header: str) -> str:
    """The name part of a Host header: `[::1]:80` -> `::1`, `Example.com.:80` -> `example.com`."""
    name = header.strip().lower()
    if name.startswith("["):
        name = name[1 : name.find("]")] if "]" in name else name
    elif name.count(":") == 1:  # a name or IPv4 address, and a port
        name = name.rsplit(":", 1)[0]
    return name.rstrip(".")


class HttpGuard:
    """ASGI middleware refusing requests that fail the checks above; `on_refuse(status)`
    is called for each refusal."""

    def __init__(
        self, app: ASGIApp, cfg: ServerConfig, on_refuse: Callable[[int], None] | None = None
    ) -> None:
        self.app = app
        self.api_key = cfg.api_key
        self.hosts = allowed_hosts(cfg)
        self.on_refuse = on_refuse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            err = self.check(scope)
            if err is not None:
                if self.on_refuse is not None:
                    self.on_refuse(err.status)
                headers = {"WWW-Authenticate": "Bearer"} if err.status == 401 else None
                response = JSONResponse(err.body(), status_code=err.status, headers=headers)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def check(self, scope: Scope) -> ApiError | None:
        """The error to answer `scope` with, or None to serve it."""
        headers = {
            k: v for k, v in scope["headers"] if k in (b"host", b"authorization", b"content-type")
        }
        host = headers.get(b"host")  # HTTP/1.0 may omit it; a browser never does
        if (
            self.hosts is not None
            and host is not None
            and host_name(host.decode("latin-1")) not in self.hosts
        ):
            return ApiError(
                400,
                "the Host header names no address this server answers to (see --allowed-hosts)",
                code="invalid_host",
            )
        if self.api_key and scope["path"] not in OPEN_PATHS:
            scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
            if scheme.lower() != b"bearer" or not key_matches(token.strip(), self.api_key):
                return ApiError(
                    401,
                    "missing or incorrect API key: send `Authorization: Bearer <key>`",
                    code="invalid_api_key",
                )
        if scope["method"] == "POST":
            media = headers.get(b"content-type", b"").split(b";", 1)[0].strip().lower()
            if media != b"application/json":
                return ApiError(
                    415, "Content-Type must be application/json", code="unsupported_media_type"
                )
        return None
