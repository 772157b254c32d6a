"""`ReqState`: the api side of one in-flight request, between the receive loop and its stream."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from runtime.api.chunk import Chunk
from runtime.api.detokenize import IncrementalDetokenizer
from runtime.api.errors import RequestFailed
from runtime.messages import ReqOut


class ReqState:
    """Output of one request not yet handed to its consumer.

    The receive loop applies each `ReqOut` as it arrives (so stop strings are found at
    once, however slow the consumer); the consumer takes everything pending as one
    `Chunk`, so a slow consumer gets fewer, larger chunks instead of a backlog.
    `detok` is None for models without a tokenizer (token ids only, empty text).
    `rid` is the caller's id (its chunks carry it), `key` the scheduler's (default: rid);
    `report_cached=False` reports 0 cached tokens (see `ServerConfig.cache_report`).
    """

    def __init__(self, rid: str, detok: IncrementalDetokenizer | None, logprobs: bool,
                 prompt_ids: list[int] | None = None, logprob_start_len: int = -1, *,
                 key: str | None = None, report_cached: bool = True) -> None:
        self.rid = rid
        self.key = rid if key is None else key
        self._report_cached = report_cached
        self.detok = detok
        self._want_logprobs = logprobs
        self._text: list[str] = []
        self._ids: list[int] = []
        self._logprobs: list[float] = []
        # input logprobs score prompt tokens from max(logprob_start_len, 1) on, in order
        self._prompt_ids = prompt_ids or []
        self._next_scored = min(max(logprob_start_len, 1), len(self._prompt_ids))
        self._input_logprobs: list[float] = []
        self._input_ids: list[int] = []
        self.finish_reason: str | None = None
        self.error: BaseException | None = None
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.completion_tokens = 0
        self.scheduler_done = False  # the scheduler finished it, or was told to abort it
        self.event = asyncio.Event()  # set when there is something to take
        # called too, each time there is something new to take (a consumer with no task)
        self.on_ready: Callable[[ReqState], None] | None = None

    @property
    def ended(self) -> bool:
        return self.finish_reason is not None or self.error is not None

    def on_output(self, out: ReqOut, text: str | None = None) -> bool:
        """Apply one ReqOut. True when a stop string ended the request here, so the
        scheduler, which is still generating it, must be told to abort.

        `text`: the output of `detok` over `out.new_ids` when the caller already fed them
        to it (a batched detokenize); None to feed them here."""
        if self.ended:
            return False
        if out.prompt_tokens:
            self.prompt_tokens = out.prompt_tokens
            self.cached_tokens = out.cached_tokens if self._report_cached else 0
        if out.input_logprobs:
            n = len(out.input_logprobs)
            self._input_logprobs.extend(out.input_logprobs)
            self._input_ids.extend(self._prompt_ids[self._next_scored:self._next_scored + n])
            self._next_scored += n
        if self.detok is None:
            text, taken = "", len(out.new_ids)
        else:
            if text is None:
                text = self.detok.add(out.new_ids)
            taken = self.detok.num_tokens - self.completion_tokens  # ids it accepted
        self._text.append(text)
        self._ids.extend(out.new_ids[:taken])
        if self._want_logprobs:
            self._logprobs.extend(out.logprobs[:taken])
        self.completion_tokens += taken
        stopped = self.detok is not None and self.detok.stop_str is not None
        must_abort = stopped and out.finish_reason is None
        self.scheduler_done = self.scheduler_done or stopped or out.finish_reason is not None
        if out.finish_reason == "error" and not stopped:
            self.error = RequestFailed(out.error or "the scheduler failed this request")
        elif stopped:
            self.finish_reason = "stop"
        elif out.finish_reason is not None:
            self._finish(out.finish_reason)
        self._wake()
        return must_abort

    def abort(self) -> None:
        """End the stream now with finish_reason "abort" (the caller tells the scheduler)."""
        if not self.ended:
            self._finish("abort")
            self._wake()

    def fail(self, error: BaseException) -> None:
        """End the stream with an error, raised to the consumer by `take`."""
        if not self.ended:
            self.error = error
            self._wake()

    def take(self) -> Chunk | None:
        """Everything pending as one chunk (None if nothing); raises the request's error."""
        if self.error is not None:
            raise self.error
        text = "".join(self._text)
        if (not text and not self._ids and not self._input_logprobs
                and self.finish_reason is None):
            return None
        chunk = Chunk(self.rid, text, self._ids, self._logprobs, self.finish_reason,
                      self.prompt_tokens, self.completion_tokens, self.cached_tokens,
                      self._input_logprobs, self._input_ids)
        self._text, self._ids, self._logprobs = [], [], []
        self._input_logprobs, self._input_ids = [], []
        return chunk

    def _wake(self) -> None:
        self.event.set()
        if self.on_ready is not None:
            self.on_ready(self)

    def _finish(self, reason: str) -> None:
        if self.detok is not None:
            self._text.append(self.detok.flush())
            if self.detok.stop_str is not None:  # the flushed tail held a stop string
                reason = "stop"
        self.finish_reason = reason
