"""SGLang's `/generate` reply: `text`, `output_ids` and `meta_info`, whole or streamed.

`SglOutput` gathers one request's output from its `RequestOutput` pieces and answers in
SGLang's shape at any point: a stream's event carries everything so far (the text, the
ids and the logprob lists are cumulative, as SGLang's streams are), the last one and a
whole reply the same with the finish reason and `e2e_latency`.

`meta_info`: `id`, `finish_reason` (null until the end, then `{"type": "stop",
"matched": <token id or stop string>}`, `{"type": "length", "length": <max_new_tokens>}`
or `{"type": "abort", "message": ...}`), `prompt_tokens`, `completion_tokens`,
`cached_tokens`, `e2e_latency` (seconds, once finished); with `return_logprob`,
`output_token_logprobs` and `input_token_logprobs` as `[logprob, token_id, text]`
entries (`text` null unless `return_text_in_logprobs`). Input logprobs start at
`logprob_start_len`: the first prompt token has no logprob (null), as in SGLang.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from runtime.api.sglang.request import SglItem
from runtime.wire.request_output import FinishReason, RequestOutput

TokenText = Callable[[int], str]  # one token id's text


class SglOutput:
    """One request's output so far, answered in SGLang's shape.

    `first_token`: the prompt's first token id, needed when input logprobs start at 0
    (SGLang lists that token with a null logprob); `token_text` decodes one id, for
    logprob entries with text (None: no text)."""

    def __init__(self, item: SglItem, *, first_token: int | None = None,
                 token_text: TokenText | None = None, index: int | None = None) -> None:
        self.item = item
        self.index = index  # in a batch: the item's place, sent with each streamed event
        self._token_text = token_text
        self._started = time.perf_counter()
        self._text: list[str] = []
        self.output_ids: list[int] = []
        self._output_logprobs: list[list[Any]] = []
        self._input_logprobs: list[list[Any]] = []
        self._output_top: list[list[list[Any]]] = []  # per token: [logprob, id, text] each
        self._input_top: list[list[list[Any]] | None] = []
        if item.return_logprob and item.logprob_start_len == 0 and first_token is not None:
            self._input_logprobs.append(self._entry(None, first_token))
            self._input_top.append(None)
        self.last: RequestOutput | None = None

    def add(self, piece: RequestOutput) -> None:
        """Take the next piece of the request's output (a delta, or the whole output)."""
        self.last = piece
        self._text.append(piece.text)
        self.output_ids.extend(piece.token_ids)
        if self.item.return_logprob:
            self._output_logprobs += [self._entry(lp, t)
                                      for lp, t in zip(piece.logprobs, piece.token_ids)]
            self._input_logprobs += [self._entry(lp, t) for lp, t in
                                     zip(piece.input_logprobs, piece.input_token_ids)]
        if self.item.params.top_logprobs:
            self._output_top += [self._alternatives(piece.top(i))
                                 for i in range(len(piece.token_ids))]
            self._input_top += [self._alternatives(piece.top(i, prompt=True))
                                for i in range(len(piece.input_logprobs))]

    def body(self) -> dict[str, Any]:
        """The reply (or streamed event) for everything so far."""
        last = self.last
        assert last is not None, "no output yet"
        text = "".join(self._text)
        self._text = [text]
        meta: dict[str, Any] = {
            "id": self.item.rid, "finish_reason": self._finish_reason(last),
            "prompt_tokens": last.prompt_tokens, "completion_tokens": last.completion_tokens,
            "cached_tokens": last.cached_tokens}
        if self.item.return_logprob:
            meta["input_token_logprobs"] = list(self._input_logprobs)
            meta["output_token_logprobs"] = list(self._output_logprobs)
        if self.item.params.top_logprobs:
            meta["input_top_logprobs"] = list(self._input_top)
            meta["output_top_logprobs"] = list(self._output_top)
        if last.finished:
            meta["e2e_latency"] = time.perf_counter() - self._started
        body = {"text": text, "output_ids": list(self.output_ids), "meta_info": meta}
        if self.index is not None:
            body["index"] = self.index
        return body

    def _alternatives(self, top: list[tuple[int, float]]) -> list[list[Any]]:
        return [self._entry(lp, t) for t, lp in top]

    def _entry(self, logprob: float | None, token: int) -> list[Any]:
        text = self._token_text(token) if self._token_text is not None else None
        return [logprob, token, text]

    def _finish_reason(self, out: RequestOutput) -> dict[str, Any] | None:
        reason = out.finish_reason
        if reason is None:
            return None
        if reason == FinishReason.STOP:
            return {"type": "stop", "matched": out.matched_stop}
        if reason == FinishReason.LENGTH:
            return {"type": "length", "length": self.item.params.max_tokens}
        return {"type": "abort", "message": f"the request ended: {reason}"}
