"""The api process: one uvloop running the TokenizerManager and the client-facing fronts.

A front is anything with `async start()` / `async close()` serving `TokenizerManager`
to clients: the native RPC server, the monitor (stats polling, metrics, health, logs)
and the HTTP server (OpenAI-compatible API, /generate, /metrics, /health), on one loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from typing import Protocol

import msgspec
import uvloop
import zmq

from runtime.api.http.server import HttpServer
from runtime.api.monitoring.monitor import Monitor
from runtime.api.rpc.server import RpcServer
from runtime.api.sampling_defaults import InvalidGenerationConfig
from runtime.api.tokenizer_manager import TokenizerManager
from runtime.config.server import ServerConfig
from runtime.model_config import spec_for
from runtime.model_errors import MODEL_ERRORS
from runtime.procutil import STOP_SIGNAL, freeze_startup_heap, startup_failure
from runtime.wire.lifecycle import Ready

log = logging.getLogger(__name__)


class Front(Protocol):
    async def start(self) -> None: ...

    async def close(self) -> None: ...


def run_api(cfg: ServerConfig) -> None:
    """Entry point of the api process.

    Waits for the scheduler's `Limits`, sends `Ready(name="api")` to the supervisor once
    the RPC socket is bound, then serves until its supervisor stops it (`STOP_SIGNAL`:
    SIGTERM and SIGINT go to the supervisor) or until the engine dies (a
    `ProcessDied` arrives). A startup failure is reported as `Ready(name="api", error=...)`
    and exits with status 1.
    """
    logging.basicConfig(
        level=cfg.log_level.upper(), format="%(asctime)s api %(levelname)s %(name)s: %(message)s"
    )
    if uvloop.run(_serve(cfg)) != 0:
        sys.exit(1)


async def _serve(cfg: ServerConfig) -> int:
    fronts: list[Front] = []
    try:
        tm = TokenizerManager(cfg, spec_for(cfg))
        await tm.start()
        # serve nothing before the scheduler's limits (context after every cap) arrive
        limits = await tm.wait_limits(cfg.ready_timeout)
        monitor = Monitor(tm, cfg)
        http = HttpServer(tm, cfg, monitor)
        rpc = RpcServer(tm, cfg.rpc_addr)
        fronts += [rpc, monitor, http]
        for front in fronts:
            await front.start()
    except Exception as e:
        error = startup_failure(log, "api", e, (*MODEL_ERRORS, InvalidGenerationConfig))
        _send_ready(cfg, Ready(name="api", error=error))
        return 1
    freeze_startup_heap()
    _send_ready(
        cfg,
        Ready(name="api", info={"rpc": rpc.addr, "http": http.url, "pid": str(os.getpid())}),
    )
    log.info(
        "api ready: rpc on %s, http on %s; context %d tokens, prompts up to %d",
        rpc.addr,
        http.url,
        limits.max_context,
        limits.max_req_input_len,
    )

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(STOP_SIGNAL, stop.set)
    stopped = asyncio.create_task(stop.wait())
    died = asyncio.create_task(tm.wait_dead())
    await asyncio.wait({stopped, died}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    died.cancel()
    # new requests are refused from here on; those in flight finish, or fail after the
    # grace (at once if the engine died), and their clients get the error before we close
    http.stop_accepting()
    await tm.drain(cfg.shutdown_grace)
    for front in reversed(fronts):
        await front.close()
    await tm.close()
    log.info("api stopped")
    return 0


def _send_ready(cfg: ServerConfig, msg: Ready) -> None:
    """Tell the supervisor (PULL bound at `ready`) how startup went."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.connect(cfg.ipc("ready"))
    sock.send(msgspec.msgpack.encode(msg))
    sock.close(linger=2000)  # let it reach the supervisor before we go on (or exit)
    ctx.term()
