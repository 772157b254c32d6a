"""Runtimes a program can run against: the server over HTTP or RPC, or an in-process Engine."""

from __future__ import annotations

from frontend.backends.base import Backend
from frontend.backends.endpoint import RuntimeEndpoint
from frontend.backends.engine import EngineBackend
from frontend.backends.http import HttpBackend
from frontend.backends.rpc import RpcBackend

__all__ = ["Backend", "EngineBackend", "HttpBackend", "RpcBackend", "RuntimeEndpoint"]
