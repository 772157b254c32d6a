"""`Backend`: what the interpreter needs from a runtime, whatever the transport."""

from __future__ import annotations

import contextlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

from runtime.wire.model_info import ModelInfo
from runtime.wire.request_output import RequestOutput

OnText = Callable[[str], None]
C = TypeVar("C")  # a client with a close() method


def follow(deltas: Generator[RequestOutput, None, None], on_text: OnText) -> RequestOutput:
    """Consume a request's streamed deltas, calling `on_text` with each new piece of
    text; return its whole output. If `on_text` raises, the stream is closed at once
    (which aborts the request)."""
    seen = []
    with contextlib.closing(deltas):
        for delta in deltas:
            seen.append(delta)
            if delta.text:
                on_text(delta.text)
    return RequestOutput.join(seen)


class PerThread(Generic[C]):
    """One client per calling thread, made on first use by `factory`, all closed together
    (a connection pool or socket is not shared across threads)."""

    def __init__(self, factory: Callable[[], C]) -> None:
        self._factory = factory
        self._local = threading.local()
        self._made: list[C] = []
        self._lock = threading.Lock()

    def get(self) -> C:
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = self._factory()
            with self._lock:
                self._made.append(client)
        return client

    def close(self) -> None:
        with self._lock:
            for client in self._made:
                client.close()
            self._made.clear()


class Backend(ABC):
    """A runtime a program runs against. Methods may be called from many threads.

    `params` are `SamplingParams` fields by name; `max_tokens=0` only prefills the prompt
    (caching it), and `logprob_start_len` asks for the prompt tokens' logprobs.
    """

    def __init__(self) -> None:
        self._info: ModelInfo | None = None
        self._info_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="sl-backend")

    @abstractmethod
    def generate(self, prompt: str, params: dict[str, Any],
                 on_text: OnText | None = None) -> RequestOutput:
        """Run one request; return its whole output. With `on_text`, stream: call it with
        each new piece of text."""

    def generate_batch(self, prompts: list[str],
                       params: dict[str, Any]) -> list[RequestOutput]:
        """Run requests concurrently (one batch on the server); results in order."""
        return list(self._pool.map(lambda p: self.generate(p, params), prompts))

    def model_info(self) -> ModelInfo:
        """The served model's name, context length and chat role markers (fetched once)."""
        with self._info_lock:
            if self._info is None:
                self._info = self._fetch_model_info()
            return self._info

    @abstractmethod
    def _fetch_model_info(self) -> ModelInfo: ...

    def cache_stats(self) -> tuple[int, int] | None:
        """(prefix-cache hit tokens, looked-up tokens) so far on the server, or None if
        this transport cannot tell."""
        return None

    def close(self) -> None:
        self._pool.shutdown(wait=False)
