"""`ReqState`: the api side of one in-flight request, between the receive loop and its consumer."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from runtime.api.detokenize import IncrementalDetokenizer
from runtime.api.errors import RequestFailed
from runtime.messages import FinishReason, ReqOut, RequestOutput


class ReqState:
    """Output of one request not yet handed to its consumer.

    The receive loop applies each `ReqOut` as it arrives (so stop strings are found at
    once, however slow the consumer), turning it into a `RequestOutput` piece. The
    consumer `take`s what is pending, joined: a streaming consumer (`stream=True`) a
    delta whenever something is new, so a slow one gets fewer, larger deltas instead of a
    backlog; any other consumer the whole output, once, when the request ended.
    `detok` is None for models without a tokenizer (token ids only, empty text).
    `rid` is the caller's id (its chunks carry it), `key` the scheduler's (default: rid);
    `report_cached=False` reports 0 cached tokens (see `ServerConfig.cache_report`).
    """

    def __init__(self, rid: str, detok: IncrementalDetokenizer | None, logprobs: bool,
                 prompt_ids: list[int] | None = None, logprob_start_len: int = -1,
                 stream: bool = True, *, key: str | None = None,
                 report_cached: bool = True) -> None:
        self.rid = rid
        self.key = rid if key is None else key
        self._report_cached = report_cached
        self.detok = detok
        self.stream = stream
        self._want_logprobs = logprobs
        self._pending: list[RequestOutput] = []
        # input logprobs score prompt tokens from max(logprob_start_len, 1) on, in order
        self._prompt_ids = prompt_ids or []
        self._next_scored = min(max(logprob_start_len, 1), len(self._prompt_ids))
        self.finish_reason: FinishReason | None = None
        self.matched_stop: int | str | None = None  # see RequestOutput.matched_stop
        self.error: BaseException | None = None
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.completion_tokens = 0
        self.scheduler_done = False  # the scheduler finished it, or was told to end it
        self.event = asyncio.Event()  # set when there is something to take
        # called too, each time there is something new to take (a consumer with no task)
        self.on_ready: Callable[[ReqState], None] | None = None

    @property
    def ended(self) -> bool:
        return self.finish_reason is not None or self.error is not None

    @property
    def ready(self) -> bool:
        """Whether `take` has something for the consumer: where delta vs whole is chosen."""
        return self.error is not None or (
            bool(self._pending) and (self.stream or self.finish_reason is not None))

    def on_output(self, out: ReqOut, text: str | None = None) -> bool:
        """Apply one ReqOut. True when a stop string ended the request here, so the
        scheduler, which is still generating it, must be told to finish it.

        `text`: the output of `detok` over `out.token_ids` when the caller already fed
        them to it (a batched detokenize); None to feed them here."""
        if self.ended:
            return False
        if out.prompt_tokens:
            self.prompt_tokens = out.prompt_tokens
            self.cached_tokens = out.cached_tokens if self._report_cached else 0
        input_ids: list[int] = []
        if out.input_logprobs:
            n = len(out.input_logprobs)
            input_ids = self._prompt_ids[self._next_scored:self._next_scored + n]
            self._next_scored += n
        if self.detok is None:
            text, taken = "", len(out.token_ids)
        else:
            if text is None:
                text = self.detok.add(out.token_ids)
            taken = self.detok.num_tokens - self.completion_tokens  # ids it accepted
        ids = out.token_ids[:taken]
        logprobs = out.logprobs[:taken] if self._want_logprobs else []
        k = len(out.top_ids) // len(out.token_ids) if out.token_ids else 0  # per token
        top = (out.top_ids[:taken * k], out.top_logprobs[:taken * k])
        self.completion_tokens += taken
        stopped = self.detok is not None and self.detok.stop_str is not None
        must_finish = stopped and out.finish_reason is None
        self.scheduler_done = self.scheduler_done or stopped or out.finish_reason is not None
        if out.finish_reason == FinishReason.ERROR and not stopped:
            self.error = RequestFailed(out.error or "the scheduler failed this request")
        elif stopped:
            self.finish_reason = FinishReason.STOP
        elif out.finish_reason is not None:
            text += self._finish(out.finish_reason)
        if self.finish_reason == FinishReason.STOP:  # a stop string, else the stop token
            stop_str = self.detok.stop_str if self.detok is not None else None
            self.matched_stop = stop_str if stop_str is not None else (ids[-1] if ids else None)
        if self.error is None and (text or ids or out.input_logprobs or self.finish_reason):
            piece = self._piece(text, ids, logprobs, out.input_logprobs, input_ids)
            piece.top_ids, piece.top_logprobs = top
            piece.input_top_ids = out.input_top_ids
            piece.input_top_logprobs = out.input_top_logprobs
            self._pending.append(piece)
        self._wake()
        return must_finish

    def abort(self) -> None:
        """End the output now with finish reason ABORT (the caller tells the scheduler)."""
        if not self.ended:
            self._pending.append(self._piece(self._finish(FinishReason.ABORT)))
            self._wake()

    def fail(self, error: BaseException) -> None:
        """End the output with an error, raised to the consumer by `take`."""
        if not self.ended:
            self.error = error
            self._wake()

    def take(self) -> RequestOutput | None:
        """The pending output as one piece, or None if not `ready`; raises the request's
        error."""
        if self.error is not None:
            raise self.error
        if not self.ready:
            return None
        out = RequestOutput.join(self._pending)
        self._pending = []
        return out

    def _piece(self, text: str, ids: list[int] | None = None, logprobs: list[float] | None = None,
               input_logprobs: list[float] | None = None,
               input_ids: list[int] | None = None) -> RequestOutput:
        return RequestOutput(rid=self.rid, text=text, token_ids=ids or [],
                             logprobs=logprobs or [], finish_reason=self.finish_reason,
                             prompt_tokens=self.prompt_tokens,
                             completion_tokens=self.completion_tokens,
                             cached_tokens=self.cached_tokens,
                             input_logprobs=input_logprobs or [],
                             input_token_ids=input_ids or [],
                             matched_stop=self.matched_stop)

    def _wake(self) -> None:
        if not self.ready:
            return
        self.event.set()
        if self.on_ready is not None:
            self.on_ready(self)

    def _finish(self, reason: FinishReason) -> str:
        """End with `reason`; return the text the detokenizer still held."""
        tail = ""
        if self.detok is not None:
            tail = self.detok.flush()
            if self.detok.stop_str is not None:  # the flushed tail held a stop string
                reason = FinishReason.STOP
        self.finish_reason = reason
        return tail
