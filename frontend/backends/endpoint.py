"""`RuntimeEndpoint`: a running `sluice serve`, reached over HTTP or RPC by its URL."""

from __future__ import annotations

from typing import Any

from frontend.backends.base import Backend, OnText
from frontend.backends.http import HttpBackend
from frontend.backends.rpc import RpcBackend
from runtime.wire.model_info import ModelInfo
from runtime.wire.request_output import RequestOutput


class RuntimeEndpoint(Backend):
    """The server at `url`: `http(s)://host:port` over HTTP, `tcp://` or `ipc://` over the
    native RPC. `transport` is the backend that does the talking; `api_key`: the server's
    key (None: SLUICE_API_KEY, if set)."""

    def __init__(self, url: str, timeout: float | None = 120.0,
                 api_key: str | None = None) -> None:
        super().__init__()
        self.url = url
        if url.startswith(("http://", "https://")):
            self.transport: Backend = HttpBackend(url, timeout, api_key)
        elif url.startswith(("tcp://", "ipc://")):
            self.transport = RpcBackend(url, timeout, api_key)
        else:
            raise ValueError(f"unknown endpoint {url!r}: expected http(s):// or tcp:// / ipc://")

    def generate(
        self, prompt: str, params: dict[str, Any], on_text: OnText | None = None
    ) -> RequestOutput:
        return self.transport.generate(prompt, params, on_text)

    def generate_batch(self, prompts: list[str], params: dict[str, Any]) -> list[RequestOutput]:
        return self.transport.generate_batch(prompts, params)

    def _fetch_model_info(self) -> ModelInfo:
        return self.transport.model_info()

    def cache_stats(self) -> tuple[int, int] | None:
        return self.transport.cache_stats()

    def close(self) -> None:
        super().close()
        self.transport.close()
