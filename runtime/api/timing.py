"""Per-request timings and token counters of the api process, fed by the TokenizerManager.

`RequestTimings` sees each request start, every `ReqOut` the scheduler sends for it, and
its end; it keeps running token totals and, when a request ends, hands a `RequestRecord`
(queue time, TTFT, inter-token gaps, end-to-end latency, finish) to its listeners: the
Prometheus metrics and the per-request log line.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from runtime.wire.api_input import ReqOut
from runtime.wire.request_output import FinishReason

log = logging.getLogger(__name__)


@dataclass(slots=True)
class RequestRecord:
    """What one finished request looked like, as clients experienced it."""

    rid: str
    outcome: FinishReason
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    queue_time: float | None  # arrival at the scheduler to first admission
    ttft: float | None  # arrival at the api to the first output token; None if none came
    e2e: float  # arrival at the api to the end
    itl: list[float] = field(default_factory=list)  # gaps between output tokens


@dataclass(slots=True)
class _Timer:
    arrival: float
    rid: str
    prompt_tokens: int = 0
    cached_tokens: int = 0
    queue_time: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    itl: list[float] = field(default_factory=list)


class RequestTimings:
    """Timestamps of the requests in flight and process-wide token totals."""

    def __init__(self) -> None:
        self._timers: dict[str, _Timer] = {}
        self.prompt_tokens = 0  # prompts of requests that reached the scheduler
        self.cached_tokens = 0  # of those, tokens served from the prefix cache
        self.generation_tokens = 0  # output tokens the scheduler produced
        self.listeners: list[Callable[[RequestRecord], None]] = []

    def start(self, key: str, arrival: float, rid: str | None = None) -> None:
        """A request was accepted; `arrival` is when it reached the api (monotonic).
        `key` is the request's id on the scheduler's wire (its ReqOuts carry it), `rid`
        the caller's (its record carries it; default: key)."""
        self._timers[key] = _Timer(arrival, key if rid is None else rid)

    def on_output(self, out: ReqOut, now: float | None = None) -> None:
        """Account for one ReqOut of a request in flight."""
        timer = self._timers.get(out.rid)
        if timer is None:
            return
        now = time.monotonic() if now is None else now
        if out.prompt_tokens:
            timer.prompt_tokens, timer.cached_tokens = out.prompt_tokens, out.cached_tokens
            timer.queue_time = out.queue_time
            self.prompt_tokens += out.prompt_tokens
            self.cached_tokens += out.cached_tokens
        self._tokens(timer, len(out.token_ids), now)

    def on_token(self, key: str, now: float) -> None:
        """Account for one output token that came alone (see `BatchOut`)."""
        timer = self._timers.get(key)
        if timer is None:
            return
        if timer.last_token is None:
            self._tokens(timer, 1, now)
            return
        self.generation_tokens += 1  # `_tokens` of one token after the first, inline
        timer.itl.append(now - timer.last_token)
        timer.last_token = now

    def _tokens(self, timer: _Timer, n: int, now: float) -> None:
        """`n` output tokens of one request arrived together at `now`."""
        if not n:
            return
        self.generation_tokens += n
        if timer.first_token is None:
            timer.first_token = now
            n -= 1  # the first token has no gap before it; any arriving with it, none either
            gap = 0.0
        else:  # tokens that arrive together share the gap since the previous arrival
            gap = (now - timer.last_token) / n
        timer.itl.extend([gap] * n)
        timer.last_token = now

    def finish(self, key: str, outcome: FinishReason, completion_tokens: int,
               now: float | None = None) -> None:
        """The request ended (or its consumer left): build its record, tell the listeners."""
        timer = self._timers.pop(key, None)
        if timer is None:
            return
        now = time.monotonic() if now is None else now
        ttft = None if timer.first_token is None else timer.first_token - timer.arrival
        record = RequestRecord(timer.rid, outcome, timer.prompt_tokens, timer.cached_tokens,
                               completion_tokens, timer.queue_time, ttft, now - timer.arrival,
                               timer.itl)
        for listener in self.listeners:
            try:
                listener(record)
            except Exception:  # a broken listener must not break the request path
                log.exception("request listener %r failed", listener)
