"""`ReqState`: the api side of one in-flight request, between the receive loop and its consumer."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from runtime.api.detokenize import IncrementalDetokenizer
from runtime.wire.api_input import ReqOut
from runtime.wire.errors import RequestFailed
from runtime.wire.request_output import FinishReason, RequestOutput


class ReqState:
    """Output of one request not yet handed to its consumer.

    The receive loop applies each `ReqOut` as it arrives (so stop strings are found at
    once, however slow the consumer), appending it to the pending `RequestOutput` (one
    object per take, not per token). The consumer `take`s what is pending: a streaming
    consumer (`stream=True`) a delta whenever something is new, so a slow one gets
    fewer, larger deltas instead of a backlog; any other consumer the whole output, once,
    when the request ended.
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
        # what `take` hands over next: one piece its outputs are appended to, and its text
        self._out: RequestOutput | None = None
        self._text: list[str] = []
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
            self._out is not None and (self.stream or self.finish_reason is not None))

    def on_output(self, out: ReqOut) -> bool:
        """Apply one ReqOut. True when a stop string ended the request here, so the
        scheduler, which is still generating it, must be told to finish it."""
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
        detok = self.detok
        if detok is None:
            text, taken = "", len(out.token_ids)
        else:
            text = detok.add(out.token_ids)
            taken = detok.num_tokens - self.completion_tokens  # ids it accepted
        self.completion_tokens += taken
        stopped = detok is not None and detok.stop_str is not None
        must_finish = stopped and out.finish_reason is None
        self.scheduler_done = self.scheduler_done or stopped or out.finish_reason is not None
        if out.finish_reason == FinishReason.ERROR and not stopped:
            self.error = RequestFailed(out.error or "the scheduler failed this request")
        elif stopped:
            self.finish_reason = FinishReason.STOP
        elif out.finish_reason is not None:
            text += self._finish(out.finish_reason)
        if self.finish_reason == FinishReason.STOP:  # a stop string, else the stop token
            stop_str = detok.stop_str if detok is not None else None
            self.matched_stop = stop_str if stop_str is not None else (
                out.token_ids[taken - 1] if taken else None)
        if self.error is None and (text or taken or out.input_logprobs or self.finish_reason):
            self._add(out, text, taken, input_ids)
        self._wake()
        return must_finish

    def on_token(self, token_id: int) -> bool:
        """Apply one output token that came alone: no header, logprobs or finish (a
        `BatchOut` column). The same as `on_output` of a ReqOut carrying just it."""
        if self.ended:
            return False
        detok = self.detok
        piece = self._add_text("" if detok is None else detok.add((token_id,)))
        piece.token_ids.append(token_id)
        self.completion_tokens += 1
        stopped = detok is not None and detok.stop_str is not None
        if stopped:  # the scheduler is still generating it: the caller tells it to finish
            self.scheduler_done = True
            self.finish_reason = FinishReason.STOP
            self.matched_stop = detok.stop_str
        self._wake()
        return stopped

    def abort(self) -> None:
        """End the output now with finish reason ABORT (the caller tells the scheduler)."""
        if not self.ended:
            self._add_text(self._finish(FinishReason.ABORT))
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
        out, self._out = self._out, None
        out.text = "".join(self._text)
        self._text = []
        out.finish_reason = self.finish_reason
        out.prompt_tokens = self.prompt_tokens
        out.completion_tokens = self.completion_tokens
        out.cached_tokens = self.cached_tokens
        out.matched_stop = self.matched_stop
        return out

    def _add_text(self, text: str) -> RequestOutput:
        """The pending piece (started if there is none), with `text` appended."""
        if self._out is None:
            self._out = RequestOutput(rid=self.rid)
        if text:
            self._text.append(text)
        return self._out

    def _add(self, out: ReqOut, text: str, taken: int, input_ids: list[int]) -> None:
        """Append the first `taken` output ids of `out` (with their logprobs and top
        alternatives), its input logprobs and `text` to the pending piece."""
        piece = self._add_text(text)
        if taken:
            n = len(out.token_ids)
            whole = taken == n
            piece.token_ids += out.token_ids if whole else out.token_ids[:taken]
            if self._want_logprobs:
                piece.logprobs += out.logprobs if whole else out.logprobs[:taken]
            if out.top_ids:
                k = len(out.top_ids) // n  # alternatives per token
                piece.top_ids += out.top_ids[:taken * k]
                piece.top_logprobs += out.top_logprobs[:taken * k]
        if out.input_logprobs:
            piece.input_logprobs += out.input_logprobs
            piece.input_token_ids += input_ids
            piece.input_top_ids += out.input_top_ids
            piece.input_top_logprobs += out.input_top_logprobs

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
