"""`RequestOutput`, a request's output on every surface, and `FinishReason`.

What the api's streams yield, what RPC carries, what `runtime.client`, `Engine` and the
frontend backends return.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from runtime.wire.record import WireRecord


class FinishReason(str, enum.Enum):
    """Why a request ended. A member equals, prints and encodes as its value, which is
    what HTTP and OpenAI responses say."""

    STOP = "stop"  # a stop token or stop string
    LENGTH = "length"  # max_tokens reached
    ABORT = "abort"  # the client went away or aborted it
    ERROR = "error"  # the server failed it

    def __str__(self) -> str:
        return self.value


class RequestOutput(WireRecord, kw_only=True):
    """Output of one request: a delta (a stream's piece) or the whole of it (`join`).

    In a delta, `text`, `token_ids`, `logprobs` and the `input_*` and `top_*` lists are new
    since the previous piece; the counters are totals so far; `finish_reason` is set on
    the last piece only. `logprobs` only when asked for; with `logprob_start_len >= 0`,
    `input_logprobs` score the prompt tokens `input_token_ids` from that position on.
    With `top_logprobs` = k, `top_ids` / `top_logprobs` hold the k most likely tokens and
    their logprobs at each output token, most likely first, flat (k per token; `top(i)`
    reads token i's), and `input_top_*` the same at each scored prompt token.
    """

    rid: str
    text: str = ""
    token_ids: list[int] = []
    logprobs: list[float] = []
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    input_logprobs: list[float] = []
    input_token_ids: list[int] = []
    top_ids: list[int] = []
    top_logprobs: list[float] = []
    input_top_ids: list[int] = []
    input_top_logprobs: list[float] = []
    # on a STOP finish: the stop token id (EOS included) or the stop string that ended it
    matched_stop: int | str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def top(self, i: int, *, prompt: bool = False) -> list[tuple[int, float]]:
        """The alternatives (token id, logprob) at output token i, most likely first; with
        `prompt`, at scored prompt token i (`input_token_ids[i]`). [] when none were asked."""
        ids, lps, n = ((self.input_top_ids, self.input_top_logprobs, len(self.input_logprobs))
                       if prompt else (self.top_ids, self.top_logprobs, len(self.token_ids)))
        k = len(ids) // n if n else 0
        return list(zip(ids[i * k:(i + 1) * k], lps[i * k:(i + 1) * k]))

    @classmethod
    def join(cls, pieces: Sequence[RequestOutput]) -> RequestOutput:
        """One output carrying a run of consecutive pieces of a request (a lone piece is
        returned as is): the lists concatenated, the counters and finish of the last."""
        if len(pieces) == 1:
            return pieces[0]
        last = pieces[-1]
        return cls(rid=last.rid, text="".join(p.text for p in pieces),
                   token_ids=[t for p in pieces for t in p.token_ids],
                   logprobs=[x for p in pieces for x in p.logprobs],
                   finish_reason=last.finish_reason, prompt_tokens=last.prompt_tokens,
                   completion_tokens=last.completion_tokens, cached_tokens=last.cached_tokens,
                   input_logprobs=[x for p in pieces for x in p.input_logprobs],
                   input_token_ids=[t for p in pieces for t in p.input_token_ids],
                   top_ids=[t for p in pieces for t in p.top_ids],
                   top_logprobs=[x for p in pieces for x in p.top_logprobs],
                   input_top_ids=[t for p in pieces for t in p.input_top_ids],
                   input_top_logprobs=[x for p in pieces for x in p.input_top_logprobs],
                   matched_stop=last.matched_stop)
