"""`Chunk`: one piece of a request's output, as `TokenizerManager.generate` yields it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from runtime.messages import RpcChunk


@dataclass(slots=True)
class Chunk:
    """New output of one request since the previous chunk.

    `text` and `token_ids` are deltas; `finish_reason` is None until the last chunk
    ("stop" | "length" | "abort"). The counters are totals so far. With
    `logprob_start_len >= 0`, `input_logprobs` are new logprobs of the prompt tokens
    `input_token_ids` (from that position on; all of them by the first chunk).
    """

    rid: str
    text: str
    token_ids: list[int]
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    input_logprobs: list[float] = field(default_factory=list)
    input_token_ids: list[int] = field(default_factory=list)


def join_chunks(rid: str, chunks: Sequence[Chunk | RpcChunk]) -> RpcChunk:
    """One RpcChunk carrying a run of chunks (a whole request's output, or one chunk)."""
    last = chunks[-1]
    return RpcChunk(rid, "".join(c.text for c in chunks),
                    [t for c in chunks for t in c.token_ids],
                    [p for c in chunks for p in c.logprobs], last.finish_reason,
                    last.prompt_tokens, last.completion_tokens, last.cached_tokens,
                    [p for c in chunks for p in c.input_logprobs],
                    [t for c in chunks for t in c.input_token_ids])
