"""`RpcBackend`: programs run against `sluice serve` over its native RPC (`tcp://...`)."""

from __future__ import annotations

from typing import Any

from frontend.backends.base import Backend, OnText, PerThread, follow
from runtime.client import Client
from runtime.wire.model_info import ModelInfo
from runtime.wire.request_output import RequestOutput


class RpcBackend(Backend):
    """One `runtime.client.Client` per thread (a Client is not thread-safe); `api_key`:
    the server's key (None: SLUICE_API_KEY, if set)."""

    def __init__(self, addr: str, timeout: float | None = 120.0,
                 api_key: str | None = None) -> None:
        super().__init__()
        self.addr = addr
        self.timeout = timeout
        self._clients: PerThread[Client] = PerThread(
            lambda: Client(self.addr, timeout=self.timeout, api_key=api_key))

    def _client(self) -> Client:
        return self._clients.get()

    def generate(self, prompt: str, params: dict[str, Any],
                 on_text: OnText | None = None) -> RequestOutput:
        if on_text is None:
            return self._client().generate(prompt, **params)
        return follow(self._client().generate(prompt, stream=True, **params), on_text)

    def _fetch_model_info(self) -> ModelInfo:
        return self._client().model_info()

    def close(self) -> None:
        super().close()
        self._clients.close()
