"""`SluiceReplica`: the Serve deployment whose every replica runs one Sluice server.

The replica starts `sluice serve` on free loopback ports (its GPUs are the ones Ray gave
the replica's actor: CUDA_VISIBLE_DEVICES is inherited) and is ready once the server's
/health answers 200. `forward` relays one HTTP request to the server and streams the
answer back; `record_autoscaling_stats` hands the autoscaling policy the server's queue
and GPU utilization; `check_health` fails once the server process is gone or /health
stops answering (Serve then replaces the replica). When Serve removes the replica it first
waits for the requests in flight (its graceful shutdown), then `__del__` stops the server.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import httpx
from ray import serve

from runtime.ray_serve.forward import ForwardRequest, ReplyHead, forwarded_headers
from runtime.ray_serve.local_server import LocalServer
from runtime.ray_serve.server_stats import load_stats

log = logging.getLogger("sluice.ray_serve")
PROBE_TIMEOUT_S = 5.0


class SluiceReplica:
    async def __init__(self, server_argv: list[str], api_key: str, ready_timeout: float,
                       stop_timeout: float) -> None:
        """`server_argv`: the `sluice serve` flags; `ready_timeout`: seconds the server may
        take to become healthy; `stop_timeout`: seconds it may take to stop on SIGTERM."""
        self._stop_timeout = stop_timeout
        # for our own /metrics scrapes only: a forwarded request carries its client's key
        self._auth = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._server = LocalServer(server_argv, api_key)
        await self._server.wait_ready(ready_timeout)
        self._http = httpx.AsyncClient(base_url=self._server.url,
                                       timeout=httpx.Timeout(None, connect=PROBE_TIMEOUT_S))
        self._id = serve.get_replica_context().replica_id.to_full_id_str()
        log.info("replica %s: server pid %d on %s", self._id, self._server.proc.pid,
                 self._server.url)

    async def forward(self, req: ForwardRequest) -> AsyncIterator[ReplyHead | bytes]:
        """The server's answer to `req`: its ReplyHead, then its body as it comes."""
        request = self._http.build_request(req.method, req.path, params=req.query,
                                           headers=list(req.headers), content=req.body)
        response = await self._http.send(request, stream=True)
        try:
            yield ReplyHead(response.status_code, forwarded_headers(response.headers.items()),
                            self._id)
            async for chunk in response.aiter_raw():
                yield chunk
        finally:
            await response.aclose()

    async def check_health(self) -> None:
        code = self._server.exit_code()
        if code is not None:
            raise RuntimeError(f"the server exited with code {code}")
        try:
            await self._http.get("/health", timeout=PROBE_TIMEOUT_S)
        except httpx.HTTPError as exc:
            raise RuntimeError(f"the server's /health did not answer: {exc!r}") from exc

    async def record_autoscaling_stats(self) -> dict[str, float]:
        response = await self._http.get("/metrics", headers=self._auth,
                                        timeout=PROBE_TIMEOUT_S)
        return load_stats(response.text)

    def __del__(self) -> None:
        server = getattr(self, "_server", None)
        if server is not None:
            code = server.stop(self._stop_timeout)
            log.info("replica stopped; its server exited with code %s", code)
