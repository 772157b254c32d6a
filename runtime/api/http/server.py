"""`HttpServer`: the HTTP front (`build_app`, `app.py`) served with uvicorn on the api
process's loop, as one of its fronts. Its protocol closes connections that are slow to
send a request or beyond `max_connections` (`connection.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
from collections.abc import Iterator

import uvicorn

from runtime.api.auth import warn_if_exposed
from runtime.api.http.app import build_app
from runtime.api.http.connection import GuardedH11Protocol, raise_fd_limit
from runtime.api.monitoring.monitor import Monitor
from runtime.api.tokenizer_manager import TokenizerManager
from runtime.config.server import ServerConfig

log = logging.getLogger(__name__)

CLOSE_MARGIN_S = 2.0  # beyond the shutdown grace: for the last responses to be written


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
