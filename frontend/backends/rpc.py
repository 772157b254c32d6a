"""`RpcBackend`: programs run against `sluice serve` over its native RPC (`tcp://...`)."""

from __future__ import annotations

from typing import Any

from frontend.backends.base import Backend, GenResult, OnText, PerThread
from runtime.client import Client
from runtime.messages import ModelInfo


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
                 on_text: OnText | None = None) -> GenResult:
        if on_text is None:
            chunks = [self._client().generate(prompt, **params)]
        else:
            chunks = []
            for chunk in self._client().generate(prompt, stream=True, **params):
                chunks.append(chunk)
                if chunk.text:
                    on_text(chunk.text)
        return GenResult.from_chunks(chunks)

    def _fetch_model_info(self) -> ModelInfo:
        return self._client().model_info()

    def close(self) -> None:
        super().close()
        self._clients.close()
