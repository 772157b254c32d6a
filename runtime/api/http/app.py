"""The HTTP front's app: an OpenAI-compatible API, `/generate` (Sluice's and SGLang's
form), SGLang's other native endpoints (`runtime.api.sglang.serving`), `/metrics` and
`/health`.

`build_app` makes the Starlette app over a running TokenizerManager and Monitor (tests
use it directly; `server.py` serves it). Errors are OpenAI error JSON with the matching
status: 400 for a bad request, 404 for an unknown model or path, 413 for a body over
`--max-request-bytes`, 429 when the queue is full, 503 when the engine is gone, 500 when
the scheduler failed the request. Before any route, `HttpGuard` checks the Host, the API
key and the Content-Type (400, 401, 415).

A client that disconnects aborts its requests (`disconnect.py`). One that disconnects
while sending its body gets the same 499 as one that leaves before its response: a
client abort, not a server error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from runtime.api.http.disconnect import ClientGone, SseResponse, disconnect_guard
from runtime.api.http.generate import NativeServing
from runtime.api.http.guard import HttpGuard
from runtime.api.http.request_body import read_body
from runtime.api.monitoring.metrics import CONTENT_TYPE
from runtime.api.monitoring.monitor import Monitor
from runtime.api.openai.protocol import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    api_error,
    decode_request,
)
from runtime.api.openai.serving import OpenAIServing
from runtime.api.sglang.serving import AbortRequest, SglangServing, TokenizeRequest
from runtime.api.streams import EventStream
from runtime.api.tokenizer_manager import TokenizerManager
from runtime.config.server import ServerConfig

log = logging.getLogger(__name__)

Endpoint = Callable[..., Awaitable[Response]]  # an `_Endpoints` method
STATS_TIMEOUT_S = 1.0  # /metrics and /health wait this long for fresh scheduler stats


def build_app(tm: TokenizerManager, cfg: ServerConfig, monitor: Monitor) -> Starlette:
    """The ASGI app; `tm` and `monitor` must run on the loop that serves it."""
    api = _Endpoints(tm, cfg, monitor)
    routes = api.routes()
    refused = monitor.metrics.http_errors
    guard = Middleware(HttpGuard, cfg=cfg, on_refuse=lambda s: refused.labels(str(s)).inc())
    return Starlette(routes=routes, middleware=[guard],
                     exception_handlers={HTTPException: _http_exception})


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return JSONResponse(ApiError(exc.status_code, str(exc.detail)).body(),
                        status_code=exc.status_code, headers=exc.headers)


def _route(path: str, *methods: str) -> Callable[[Endpoint], Endpoint]:
    """Serve the decorated endpoint at `path` for `methods` (GET when none are named)."""

    def mark(endpoint: Endpoint) -> Endpoint:
        endpoint.paths = [(path, methods or ("GET",)), *getattr(endpoint, "paths", ())]
        return endpoint

    return mark


class _Endpoints:
    """The routes' handlers, each declaring its paths with `_route`."""

    def __init__(self, tm: TokenizerManager, cfg: ServerConfig, monitor: Monitor) -> None:
        self.tm = tm
        self.cfg = cfg
        self.monitor = monitor
        self.created = int(time.time())
        self.openai = OpenAIServing(tm, (cfg.model,))
        self.sglang = SglangServing(tm, cfg)
        self.native = NativeServing(tm, self.sglang)

    def routes(self) -> list[Route]:
        """A route for every path of every endpoint, in the order they are declared."""
        return [Route(path, getattr(self, name), methods=list(methods))
                for name, endpoint in vars(_Endpoints).items()
                for path, methods in getattr(endpoint, "paths", ())]

    @_route("/v1/completions", "POST")
    async def completions(self, request: Request) -> Response:
        return await self._serve(request, CompletionRequest, self.openai.completions)

    @_route("/v1/chat/completions", "POST")
    async def chat(self, request: Request) -> Response:
        return await self._serve(request, ChatCompletionRequest, self.openai.chat)

    @_route("/generate", "POST", "PUT")
    async def generate(self, request: Request) -> Response:
        return await self._serve(request, dict[str, Any], self.native.generate)

    @_route("/abort_request", "POST")
    async def abort_request(self, request: Request) -> Response:
        return await self._serve(request, AbortRequest, self.sglang.abort_request)

    @_route("/encode", "POST", "PUT")
    @_route("/tokenize", "POST")
    async def tokenize(self, request: Request) -> Response:
        return await self._serve(request, TokenizeRequest, self.sglang.tokenize)

    @_route("/server_info")
    @_route("/get_server_info")
    async def server_info(self, request: Request) -> Response:
        await self.monitor.refresh(STATS_TIMEOUT_S)
        return await self._answer(self.sglang.server_info(self.monitor.health.latest))

    @_route("/flush_cache", "GET", "POST")
    async def flush_cache(self, request: Request) -> Response:
        return await self._answer(self.sglang.flush_cache())

    @_route("/health_generate")
    async def health_generate(self, request: Request) -> Response:
        return await self._answer(self.sglang.health_generate())

    @_route("/v1/models")
    async def models(self, request: Request) -> Response:
        """The base model, then its LoRA adapters (each with the base as `parent`)."""
        cards = [self._model_card()] + [self._model_card(n) for n in self.tm.lora_names]
        return JSONResponse({"object": "list", "data": cards})

    @_route("/v1/models/{model:path}")
    async def model(self, request: Request) -> Response:
        try:
            adapter = self.openai.check_model(request.path_params["model"])
        except ApiError as e:
            return self._error(e)
        return JSONResponse(self._model_card(adapter))

    @_route("/get_model_info")
    @_route("/model_info")
    async def model_info(self, request: Request) -> Response:
        """The model's name, context length and chat role markers (`ModelInfo`), and
        SGLang's `/model_info` keys."""
        return JSONResponse(self.sglang.model_info())

    @_route("/metrics")
    async def metrics(self, request: Request) -> Response:
        await self.monitor.refresh(STATS_TIMEOUT_S)
        return Response(self.monitor.metrics.render(), media_type=CONTENT_TYPE)

    @_route("/health")
    async def health(self, request: Request) -> Response:
        if self.tm.dead is None:
            await self.monitor.refresh(STATS_TIMEOUT_S)
        report = self.monitor.health_report()
        return JSONResponse(report.to_json(), status_code=report.http_status)

    def _model_card(self, adapter: str | None = None) -> dict[str, Any]:
        """The OpenAI model object of the base model, or of one of its LoRA adapters."""
        card = {"id": adapter or self.cfg.model, "object": "model", "created": self.created,
                "owned_by": "sluice", "root": adapter or self.cfg.model,
                "max_model_len": self.tm.context_len}
        return card if adapter is None else card | {"parent": self.cfg.model}

    async def _serve(self, request: Request, typ: type,
                     handler: Callable[[Any, Any], Awaitable[Any]]) -> Response:
        """Decode, run, and answer: JSON, an SSE stream, or an error."""
        try:
            req = decode_request(await read_body(request, self.tm.max_request_bytes), typ)
            result = await handler(req, disconnect_guard(request))
        except (ClientGone, ClientDisconnect):  # e.g. cut off while sending its body
            return Response(status_code=499)  # nginx's "client closed request"; nobody reads it
        except Exception as e:
            return self._error(e)
        if isinstance(result, EventStream):
            return SseResponse(result)
        if result is None:
            return Response(status_code=200)
        return Response(msgspec.json.encode(result), media_type="application/json")

    async def _answer(self, work: Awaitable[Any]) -> Response:
        """Await a body-less endpoint's result: JSON, text, an empty 200, or an error."""
        try:
            result = await work
        except Exception as e:
            return self._error(e)
        if result is None:
            return Response(status_code=200)
        if isinstance(result, str):
            return PlainTextResponse(result)
        return Response(msgspec.json.encode(result), media_type="application/json")

    def _error(self, exc: Exception) -> Response:
        err = api_error(exc)
        if err.status >= 500 and not isinstance(exc, ApiError):
            log.error("request failed: %s", exc, exc_info=err.status == 500)
        self.monitor.metrics.http_errors.labels(str(err.status)).inc()
        return JSONResponse(err.body(), status_code=err.status)
