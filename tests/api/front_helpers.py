"""Both fronts of the api process (HTTP and RPC) over a TokenizerManager on a background
loop, as `run_api_server` runs them, for tests against a fake scheduler."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from runtime.api.http.server import HttpServer
from runtime.api.loop_thread import LoopThread
from runtime.api.monitoring.monitor import Monitor
from runtime.api.rpc.server import RpcServer
from runtime.api.tokenizer_manager import TokenizerManager
from runtime.config.server import ServerConfig


@dataclass
class Fronts:
    tm: TokenizerManager
    url: str  # the HTTP server's, with the port it bound
    rpc_addr: str  # the RPC server's, with the port it bound
    loop: LoopThread

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])


@contextlib.contextmanager
def fronts(cfg: ServerConfig, spec) -> Iterator[Fronts]:
    """TokenizerManager, Monitor, RpcServer and HttpServer on a background loop."""
    lt = LoopThread()
    tm = TokenizerManager(cfg, spec)
    monitor = Monitor(tm, cfg)
    http = HttpServer(tm, cfg, monitor)
    rpc = RpcServer(tm, cfg.rpc_addr)
    lt.run(tm.start())
    lt.run(tm.wait_limits(10))  # as the api process does before serving
    for front in (rpc, monitor, http):
        lt.run(front.start())
    try:
        yield Fronts(tm, http.url, rpc.addr, lt)
    finally:
        for front in (http, monitor, rpc):
            lt.run(front.close())
        lt.run(tm.close())
        lt.close()
