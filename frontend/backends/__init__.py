"""Runtimes a program can run against: the server over HTTP or RPC, or an in-process Engine."""

from __future__ import annotations

from frontend.backends.base import Backend
from frontend.backends.engine import EngineBackend
from frontend.backends.http import HttpBackend
from frontend.backends.rpc import RpcBackend


def RuntimeEndpoint(url: str, timeout: float | None = 120.0) -> Backend:
    """A running `sluice serve`: `http://host:port` (HTTP) or `tcp://host:port` (RPC)."""
    if url.startswith(("http://", "https://")):
        return HttpBackend(url, timeout)
    if url.startswith(("tcp://", "ipc://")):
        return RpcBackend(url, timeout)
    raise ValueError(f"unknown endpoint {url!r}: expected http(s):// or tcp:// / ipc://")


__all__ = ["Backend", "EngineBackend", "HttpBackend", "RpcBackend", "RuntimeEndpoint"]
