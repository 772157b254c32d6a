"""The HTTP front: an OpenAI-compatible API, `/generate` (Sluice's and SGLang's form),
SGLang's other native endpoints (`runtime.api.sglang.serving`), `/metrics` and `/health`.

`build_app` makes the Starlette app over a running TokenizerManager and Monitor (tests
use it directly); `HttpServer` serves that app with uvicorn on the api process's loop, as
one of its fronts. Errors are OpenAI error JSON with the matching status: 400 for a bad
request, 404 for an unknown model or path, 413 for a body over `--max-request-bytes`,
429 when the queue is full, 503 when the engine is gone, 500 when the scheduler failed
the request. Before any route, `HttpGuard` checks the Host, the API key and the
Content-Type (400, 401, 415); the protocol closes connections that are slow to send
a request or beyond `max_connections` (`connection`).

A client that disconnects aborts its requests: while an SSE response streams, Starlette
stops it and the response closes the request streams behind it; before that (waiting for
the first token, or for a whole non-streamed response) a watcher on the ASGI `receive`
channel cancels the work. One that disconnects while sending its body gets the same
499 as one that leaves before its response: a client abort, not a server error.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import msgspec
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from runtime.api.auth import warn_if_exposed
from runtime.api.http.connection import GuardedH11Protocol, raise_fd_limit
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

T = TypeVar("T")
Endpoint = Callable[..., Awaitable[Response]]  # an `_Endpoints` method
STATS_TIMEOUT_S = 1.0  # /metrics and /health wait this long for fresh scheduler stats
CLOSE_MARGIN_S = 2.0  # beyond the shutdown grace: for the last responses to be written


class ClientGone(Exception):
    """The HTTP client disconnected before its response started."""


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
            result = await handler(req, _guard(request))
        except (ClientGone, ClientDisconnect):  # e.g. cut off while sending its body
            return Response(status_code=499)  # nginx's "client closed request"; nobody reads it
        except Exception as e:
            return self._error(e)
        if isinstance(result, EventStream):
            return _SseResponse(result)
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


def _guard(request: Request) -> Callable[[Awaitable[T]], Awaitable[T]]:
    """Await something, but cancel it and raise `ClientGone` if the client disconnects."""

    async def guard(aw: Awaitable[T]) -> T:
        work = asyncio.ensure_future(aw)
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not work.done():
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await work
        if work.cancelled():
            raise ClientGone
        return work.result()

    return guard


async def _disconnected(request: Request) -> None:
    """Return when the client disconnects (the body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class _SseResponse(StreamingResponse):
    """Streams an EventStream; closes its request streams however the response ends."""

    def __init__(self, body: EventStream) -> None:
        super().__init__(body.events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache"})
        self._streams = body.streams

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._streams.aclose()


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: the api process owns SIGINT and SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HttpServer:
    """A front serving `build_app(...)` on `cfg.host:cfg.port` with uvicorn."""

    def __init__(self, tm: TokenizerManager, cfg: ServerConfig, monitor: Monitor) -> None:
        self.cfg = cfg
        self.app = build_app(tm, cfg, monitor)
        self._server: _Server | None = None
        self._task: asyncio.Task | None = None
        self.port = cfg.port  # once started, the port bound (a free one for `--port 0`)

    @property
    def url(self) -> str:
        return f"http://{self.cfg.host}:{self.port}"

    async def start(self) -> None:
        """Bind the port (raising OSError if it is taken), then serve in a task."""
        warn_if_exposed("HTTP", self.cfg.host, self.cfg.api_key)
        fds = raise_fd_limit()
        if fds < self.cfg.max_connections + 256:  # room for the ZMQ sockets and RPC peers
            log.warning("the open-file limit (%d) is low for max_connections=%d", fds,
                        self.cfg.max_connections)
        family = socket.AF_INET6 if ":" in self.cfg.host else socket.AF_INET
        sock = socket.create_server((self.cfg.host, self.cfg.port), family=family)
        self.port = sock.getsockname()[1]
        protocol = functools.partial(GuardedH11Protocol, read_timeout=self.cfg.read_timeout,
                                     max_connections=self.cfg.max_connections)
        config = uvicorn.Config(self.app, log_config=None, log_level=self.cfg.log_level,
                                access_log=False, lifespan="off", http=protocol,
                                timeout_graceful_shutdown=self.cfg.shutdown_grace
                                + CLOSE_MARGIN_S)
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name="http")
        while not self._server.started:
            if self._task.done():
                sock.close()
                self._task.result()
                raise RuntimeError("the HTTP server stopped during start-up")
            await asyncio.sleep(0.01)

    def stop_accepting(self) -> None:
        """Close the listening socket; open responses go on (until `close`)."""
        if self._server is not None:
            self._server.should_exit = True

    async def close(self) -> None:
        """Stop accepting; give open responses the shutdown grace and a moment more, then
        cancel them (aborting)."""
        if self._task is None:
            return
        self._server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        self._task = None
