"""Runtimes a program can run against: the server over HTTP or RPC, or an in-process Engine."""

from __future__ import annotations

from frontend.backends.base import Backend, GenResult
from frontend.backends.engine import EngineBackend
from frontend.backends.http import HttpBackend
from frontend.backends.rpc import RpcBackend


def RuntimeEndpoint(url: str, timeout: float | None = 120.0,
                    api_key: str | None = None) -> Backend:
    """A running `sluice serve`: `http://host:port` (HTTP) or `tcp://host:port` (RPC);
    `api_key`: its key (None: SLUICE_API_KEY, if set)."""
    if url.startswith(("http://", "https://")):
        return HttpBackend(url, timeout, api_key)
    if url.startswith(("tcp://", "ipc://")):
        return RpcBackend(url, timeout, api_key)
    raise ValueError(f"unknown endpoint {url!r}: expected http(s):// or tcp:// / ipc://")


__all__ = ["Backend", "EngineBackend", "GenResult", "HttpBackend", "RpcBackend",
           "RuntimeEndpoint"]
