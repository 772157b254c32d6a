"""`RpcBackend`: programs run against `sluice serve` over its native RPC (`tcp://...`)."""

from __future__ import annotations

import threading
from typing import Any

from frontend.backends.base import Backend, GenResult, OnText
from runtime.client import Client
from runtime.messages import ModelInfo


class RpcBackend(Backend):
    """One `runtime.client.Client` per thread (a Client is not thread-safe)."""

    def __init__(self, addr: str, timeout: float | None = 120.0) -> None:
        super().__init__()
        self.addr = addr
        self.timeout = timeout
        self._local = threading.local()
        self._clients: list[Client] = []
        self._lock = threading.Lock()

    def _client(self) -> Client:
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = Client(self.addr, timeout=self.timeout)
            with self._lock:
                self._clients.append(client)
        return client

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
        with self._lock:
            for client in self._clients:
                client.close()
            self._clients.clear()
