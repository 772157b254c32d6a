"""scheduler (and supervisor) -> api: outputs, stats, limits and failures (`ApiInput`)."""

from __future__ import annotations

from runtime.wire.lifecycle import ProcessDied
from runtime.wire.record import WireRecord
from runtime.wire.request_output import FinishReason


class ReqOut(WireRecord):
    """New tokens of one request since its last ReqOut; `finish_reason` set on the last.

    Not a `RequestOutput`: it carries sampled ids before detokenization (the api may drop
    some past a stop string) and no text, once per request per step, on the hot path.
    Fields it shares with `RequestOutput` have the same names and meanings.
    """

    rid: str
    token_ids: list[int] = []
    logprobs: list[float] = []
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None
    queue_time: float = 0.0  # on the first ReqOut: seconds from arrival to first admission
    # new input logprobs (in prompt order, from `SamplingParams.logprob_start_len` on)
    input_logprobs: list[float] = []
    # with `SamplingParams.top_logprobs` = k: the k most likely tokens (most likely first)
    # and their logprobs at each new token, flat ([len(token_ids) * k]), and at each new
    # input logprob ([len(input_logprobs) * k])
    top_ids: list[int] = []
    top_logprobs: list[float] = []
    input_top_ids: list[int] = []
    input_top_logprobs: list[float] = []


class BatchOut(WireRecord):
    """What the api must apply after a scheduler step.

    A request whose only news is one output token (its header already sent, no logprobs,
    no finish: the bulk of a decode step) is in the columns `rids` / `next_ids` instead of
    a ReqOut each; the receiver applies the columns first, then `outs` in order (the
    sender puts a request's later news in `outs` once it has a ReqOut there).
    """

    outs: list[ReqOut]
    rids: list[str] = []
    next_ids: list[int] = []

    def expanded(self) -> list[ReqOut]:
        """Every output as a ReqOut, in the order they apply."""
        return [ReqOut(r, [t]) for r, t in zip(self.rids, self.next_ids)] + self.outs


class SchedulerStats(WireRecord):
    """A snapshot of the scheduler's queues and KV pool (reply to GetStats)."""

    token: int
    running: int
    waiting: int
    kv_total: int
    kv_free: int
    kv_cached: int  # evictable prefix-cache slots
    kv_used: int  # held by requests (their own slots and locked prefixes)
    num_steps: int
    num_retractions: int
    prefix_hit_tokens: int
    prefix_query_tokens: int
    invariant_error: str | None = None
    kv_held: int = 0  # of kv_used, slots holding live tokens (less when KV is reserved ahead)
    degraded: bool = False  # degraded mode: max_tokens and batch size capped
    # the host tier (`--host-kv-gib`): slots, prompt tokens served from it, copy traffic
    host_kv_total: int = 0
    host_kv_used: int = 0
    host_hit_tokens: int = 0  # of prefix_hit_tokens, loaded back from the host
    writeback_bytes: int = 0
    load_bytes: int = 0
    writeback_seconds: float = 0.0
    load_seconds: float = 0.0
    num_swaps: int = 0  # of num_retractions, requests whose KV went to the host tier


class CacheFlushed(WireRecord):
    """Reply to FlushCache: whether the prefix cache was flushed, and what happened."""

    token: int
    ok: bool
    message: str = ""
    freed_tokens: int = 0  # cached token slots given back to the pool


class Limits(WireRecord):
    """The request limits after every cap (the model's context, the worker's KV pool and
    sliding window, the scheduler's KV manager), sent once by the scheduler at start-up.

    The api derives every limit it checks or advertises from this record alone.
    """

    max_context: int  # prompt + output tokens of one request
    max_req_input_len: int  # prompt tokens of one request (max_context - 1: one to sample)
    max_running: int  # requests running at once
    kv_slots: int  # the KV pool, in token slots
    model_max_context: int = 0  # the model's own context length, before the caps
    kv_dtype: str = ""  # the worker's KV storage (WorkerReady.kv_dtype)
    quantization: str = "none"  # the worker's weight quantization (WorkerReady.quantization)


ApiInput = BatchOut | SchedulerStats | ProcessDied | Limits | CacheFlushed
