"""`HttpBackend`: programs run against `sluice serve` over HTTP (`/generate`, SSE)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec

from frontend.backends.base import Backend, OnText, PerThread, follow
from runtime.client.core import api_key_or_env
from runtime.wire.errors import InvalidRequest, Unauthorized
from runtime.wire.model_info import ModelInfo
from runtime.wire.request_output import FinishReason, RequestOutput


class ServerError(RuntimeError):
    """The server answered with an error (other than a bad request)."""


class HttpBackend(Backend):
    """Talks to `url` (e.g. http://127.0.0.1:30000); one connection pool per thread.
    `api_key`: the server's key, sent as a Bearer token (None: SLUICE_API_KEY, if set)."""

    def __init__(self, url: str, timeout: float | None = 120.0,
                 api_key: str | None = None) -> None:
        super().__init__()
        self.url = url.rstrip("/")
        self.timeout = timeout
        key = api_key_or_env(api_key)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._clients: PerThread[httpx.Client] = PerThread(
            lambda: httpx.Client(base_url=self.url, timeout=self.timeout, headers=headers))

    def _http(self) -> httpx.Client:
        return self._clients.get()

    def generate(self, prompt: str, params: dict[str, Any],
                 on_text: OnText | None = None) -> RequestOutput:
        body = {"text": prompt, "sampling_params": params, "stream": on_text is not None}
        if on_text is None:
            resp = self._http().post("/generate", json=body)
            _raise_for_error(resp.status_code, resp.content)
            return _output(resp.json())
        return follow(self._stream(body), on_text)

    def _stream(self, body: dict[str, Any]) -> Iterator[RequestOutput]:
        """The deltas of a streamed `/generate`."""
        with self._http().stream("POST", "/generate", json=body) as resp:
            if resp.status_code != 200:
                _raise_for_error(resp.status_code, resp.read())
            for line in resp.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[len("data: "):])
                if "error" in event:
                    raise ServerError(event["error"].get("message", str(event["error"])))
                yield _output(event)

    def _fetch_model_info(self) -> ModelInfo:
        resp = self._http().get("/get_model_info")
        _raise_for_error(resp.status_code, resp.content)
        return msgspec.json.decode(resp.content, type=ModelInfo)

    def cache_stats(self) -> tuple[int, int]:
        """The prefix-cache counters of `/metrics`."""
        resp = self._http().get("/metrics")
        _raise_for_error(resp.status_code, resp.content)
        values = {}
        for line in resp.text.splitlines():
            name, _, value = line.partition(" ")
            values[name] = value
        return (int(float(values["sluice_prefix_cache_hit_tokens_total"])),
                int(float(values["sluice_prefix_cache_query_tokens_total"])))

    def close(self) -> None:
        super().close()
        self._clients.close()


def _raise_for_error(status: int, content: bytes) -> None:
    if status == 200:
        return
    try:
        message = json.loads(content)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = content.decode(errors="replace")
    if status == 400:
        raise InvalidRequest(message)
    if status == 401:
        raise Unauthorized(message)
    raise ServerError(f"HTTP {status}: {message}")


def _output(body: dict[str, Any]) -> RequestOutput:
    """The `RequestOutput` of a `/generate` response or streamed event."""
    usage, reason = body["usage"], body["finish_reason"]
    # alternatives come as [[token_id, logprob], ...] per token: flat, as RequestOutput holds them
    top = [pair for alts in body.get("top_logprobs", []) for pair in alts]
    input_top = [pair for alts in body.get("input_top_logprobs", []) for pair in alts]
    return RequestOutput(
        rid=body["id"], text=body["text"], token_ids=body["output_ids"],
        logprobs=body.get("logprobs", []),
        finish_reason=None if reason is None else FinishReason(reason),
        prompt_tokens=usage["prompt_tokens"], completion_tokens=usage["completion_tokens"],
        cached_tokens=usage["cached_tokens"], input_logprobs=body.get("input_logprobs", []),
        input_token_ids=body.get("input_token_ids", []),
        top_ids=[t for t, _ in top], top_logprobs=[lp for _, lp in top],
        input_top_ids=[t for t, _ in input_top], input_top_logprobs=[lp for _, lp in input_top])
