"""Every message that crosses a process boundary, as msgspec Structs.

Channels (each a tagged union, decoded by `runtime.ipc`):
  api -> scheduler      `SchedulerInput`  = GenerateReq | AbortReq | FinishReq | GetStats | Shutdown
                                            | FlushCache
  scheduler -> api      `ApiInput`        = BatchOut | SchedulerStats | ProcessDied | Limits
                                            | CacheFlushed
  scheduler -> worker   `WorkerInput`     = BatchPlan | GrammarCacheUpdate | Shutdown
  worker -> scheduler   `WorkerOutput`    = StepResult | WorkerReady | WorkerFailed
                                            | GrammarCompiled
  any -> supervisor     `Ready`
  RPC client <-> api    `RpcInput` = RpcGenerate | RpcAbort | RpcGetModelInfo ;
                        `RpcOutput` = RequestOutput | RpcBatch | RpcError | RpcModelInfo

`RequestOutput` is a request's output on every surface: what the api's streams yield, what
RPC carries, what `runtime.client`, `Engine` and the frontend backends return.

Structs are array-like on the wire: new fields are only ever appended, with defaults.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from typing import Annotated

import msgspec

_WIRE = dict(tag=True, array_like=True, omit_defaults=True, gc=False)

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
# an int the scheduler and worker can hold: decoding a wider one is a validation error
Int64 = Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)]
MAX_STOP_STRINGS = 16  # per request (OpenAI allows 4)
MAX_STOP_CHARS = 1024  # the stop strings of a request together
MAX_TOP_LOGPROBS = 20  # alternatives per scored token (OpenAI's chat bound)
MAX_LOGIT_BIAS = 100.0  # |logit_bias| bound (OpenAI's)


class InvalidRequest(ValueError):
    """A request was rejected before it reached the scheduler (bad prompt or parameters)."""


class SamplingParams(msgspec.Struct, kw_only=True, omit_defaults=True):
    """How to sample one request. `temperature=0` is greedy."""

    max_tokens: Int64 = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: Int64 = -1  # -1 or 0: disabled
    min_p: float = 0.0
    seed: Int64 | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = []  # at most MAX_STOP_STRINGS, MAX_STOP_CHARS in all
    stop_token_ids: list[Int64] = []
    ignore_eos: bool = False
    logprobs: bool = False
    # The most likely alternatives of each scored token (output, and input from
    # `logprob_start_len` on), at most MAX_TOP_LOGPROBS; > 0 implies `logprobs`.
    top_logprobs: Int64 = 0
    skip_special_tokens: bool = True
    priority: Int64 = 0
    # Input (prompt) logprobs: the logprob of every prompt token from this position on,
    # given the tokens before it (-1: off). Position 0 has no logprob (nothing precedes
    # it): 0 means the same as 1. The prefix cache is not used from here on.
    logprob_start_len: Int64 = -1
    # Constrain the output to a full match of this regex (ends with EOS once complete).
    regex: str | None = None
    # Constrain the output to JSON valid under this JSON schema (a JSON text); at most one
    # of `regex` and `json_schema`.
    json_schema: str | None = None
    # Added to the logits before penalties, masks and temperature: token id -> bias in
    # [-MAX_LOGIT_BIAS, MAX_LOGIT_BIAS] (-100 all but bans a token, 100 all but forces it).
    logit_bias: dict[Int64, float] = {}
    # Only these tokens may be sampled (None: any); not with `regex` or `json_schema`.
    allowed_token_ids: list[Int64] | None = None
    # The LoRA adapter to run the request with, by its `--lora-paths` name (None: the base
    # model alone).
    lora: str | None = None

    def validate(self) -> None:
        """Raise `InvalidRequest` naming the first bad field."""
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        for name in ("max_tokens", "top_k", "seed", "priority", "logprob_start_len",
                     "top_logprobs"):
            value = getattr(self, name)
            if isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:
                raise InvalidRequest(f"{name} must be a 64-bit int (in [-2**63, 2**63 - 1])")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidRequest(f"at most {MAX_STOP_STRINGS} stop strings are allowed, "
                                 f"got {len(self.stop)}")
        checks = [
            (isinstance(self.max_tokens, int) and self.max_tokens >= 0, "max_tokens must be >= 0"),
            (_finite(self.temperature) and self.temperature >= 0, "temperature must be >= 0"),
            (_finite(self.top_p) and 0 < self.top_p <= 1, "top_p must be in (0, 1]"),
            (isinstance(self.top_k, int) and self.top_k >= -1, "top_k must be -1 (off) or >= 0"),
            (_finite(self.min_p) and 0 <= self.min_p <= 1, "min_p must be in [0, 1]"),
            (_finite(self.frequency_penalty) and -2 <= self.frequency_penalty <= 2,
             "frequency_penalty must be in [-2, 2]"),
            (_finite(self.presence_penalty) and -2 <= self.presence_penalty <= 2,
             "presence_penalty must be in [-2, 2]"),
            (_finite(self.repetition_penalty) and self.repetition_penalty > 0,
             "repetition_penalty must be > 0"),
            (all(isinstance(s, str) and s for s in self.stop), "stop strings must be non-empty"),
            (sum(len(s) for s in self.stop if isinstance(s, str)) <= MAX_STOP_CHARS,
             f"stop strings may have at most {MAX_STOP_CHARS} characters in all"),
            (all(isinstance(t, int) and 0 <= t <= INT64_MAX for t in self.stop_token_ids),
             "stop_token_ids must be non-negative 64-bit ints"),
            (isinstance(self.logprob_start_len, int) and self.logprob_start_len >= -1,
             "logprob_start_len must be -1 (off) or >= 0"),
            (self.regex is None or (isinstance(self.regex, str) and self.regex != ""),
             "regex must be a non-empty string"),
            (isinstance(self.top_logprobs, int)
             and 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS,
             f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}]"),
            (self.json_schema is None
             or (isinstance(self.json_schema, str) and self.json_schema != ""),
             "json_schema must be a non-empty string"),
            (self.regex is None or self.json_schema is None,
             "give at most one of regex and json_schema"),
            (self.lora is None or (isinstance(self.lora, str) and 0 < len(self.lora) <= 64),
             "lora must be an adapter name (1 to 64 characters)"),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidRequest(message)
        self._check_token_sets()
        if self.top_logprobs:
            self.logprobs = True

    def _check_token_sets(self) -> None:
        """`logit_bias` and `allowed_token_ids` (their ids' range: `check_vocab`)."""
        if self.logit_bias is None:
            self.logit_bias = {}
        bias, allowed = self.logit_bias, self.allowed_token_ids
        if not isinstance(bias, dict):
            raise InvalidRequest("logit_bias must map token ids to biases")
        for token, value in bias.items():
            if not _token_id(token):
                raise InvalidRequest(f"logit_bias keys must be token ids (ints >= 0), "
                                     f"got {token!r}")
            if not (_finite(value) and abs(value) <= MAX_LOGIT_BIAS):
                raise InvalidRequest(f"logit_bias values must be in [-{MAX_LOGIT_BIAS:g}, "
                                     f"{MAX_LOGIT_BIAS:g}], got {value!r} for token {token}")
        if allowed is None:
            return
        if not isinstance(allowed, list) or not allowed:
            raise InvalidRequest("allowed_token_ids must be a non-empty list of token ids")
        if not all(_token_id(t) for t in allowed):
            raise InvalidRequest("allowed_token_ids must be token ids (ints >= 0)")
        if self.grammar is not None:
            raise InvalidRequest("allowed_token_ids cannot be combined with regex or "
                                 "json_schema")

    def check_vocab(self, vocab_size: int) -> None:
        """Raise `InvalidRequest` if `logit_bias` or `allowed_token_ids` (validated) names a
        token outside the vocabulary [0, vocab_size)."""
        for name, ids in (("logit_bias", self.logit_bias),
                          ("allowed_token_ids", self.allowed_token_ids or ())):
            if ids and max(ids) >= vocab_size:
                raise InvalidRequest(f"{name} token id {max(ids)} is outside the vocabulary "
                                     f"[0, {vocab_size})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def grammar(self) -> str | None:
        """The output constraint as one grammar key (`GrammarCacheUpdate`): "regex:<regex>"
        or "json:<schema>", or None when the output is free."""
        if self.regex is not None:
            return "regex:" + self.regex
        if self.json_schema is not None:
            return "json:" + self.json_schema
        return None

    @property
    def uses_penalties(self) -> bool:
        return (self.frequency_penalty != 0.0 or self.presence_penalty != 0.0
                or self.repetition_penalty != 1.0)


def _finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _token_id(t: object) -> bool:
    return isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= INT64_MAX


class FinishReason(str, enum.Enum):
    """Why a request ended. A member equals, prints and encodes as its value, which is
    what HTTP and OpenAI responses say."""

    STOP = "stop"  # a stop token or stop string
    LENGTH = "length"  # max_tokens reached
    ABORT = "abort"  # the client went away or aborted it
    ERROR = "error"  # the server failed it

    def __str__(self) -> str:
        return self.value


# ---------------------------------------------------------------- api -> scheduler
class GenerateReq(msgspec.Struct, **_WIRE):
    """A tokenized request. `stop_ids` already includes EOS unless ignore_eos."""

    rid: str
    input_ids: list[int]
    params: SamplingParams
    stop_ids: list[int] = []


class AbortReq(msgspec.Struct, **_WIRE):
    """End a request early: its client is gone or aborted it (ABORT), or the api failed
    it (ERROR, its KV is not cached). The scheduler answers with that finish reason."""

    rid: str
    reason: FinishReason = FinishReason.ABORT


class FinishReq(msgspec.Struct, **_WIRE):
    """The api finished a request itself (a stop string matched; its client already has
    the whole output): the scheduler ends it as a normal stop and answers nothing."""

    rid: str


class Shutdown(msgspec.Struct, **_WIRE):
    pass


class GetStats(msgspec.Struct, **_WIRE):
    """Ask the scheduler for a SchedulerStats snapshot (answered on the api channel)."""

    token: int = 0


class FlushCache(msgspec.Struct, **_WIRE):
    """Drop every cached prefix that no request holds (answered with `CacheFlushed`).
    Refused while requests wait or run; done once the batches in flight completed."""

    token: int = 0


# ---------------------------------------------------------------- scheduler -> api
class ReqOut(msgspec.Struct, **_WIRE):
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


class BatchOut(msgspec.Struct, **_WIRE):
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


class SchedulerStats(msgspec.Struct, **_WIRE):
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


class CacheFlushed(msgspec.Struct, **_WIRE):
    """Reply to FlushCache: whether the prefix cache was flushed, and what happened."""

    token: int
    ok: bool
    message: str = ""
    freed_tokens: int = 0  # cached token slots given back to the pool


class Limits(msgspec.Struct, **_WIRE):
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


class ProcessDied(msgspec.Struct, **_WIRE):
    """Sent by the supervisor: a server process exited; fail everything in flight."""

    name: str
    exitcode: int | None = None


# ---------------------------------------------------------------- scheduler -> worker
class RowInit(msgspec.Struct, **_WIRE):
    """Bind a request to a row of the worker's tables (on admission or re-admission)."""

    row: int
    params: SamplingParams
    prompt_ids: list[int] = []  # only when repetition_penalty != 1
    output_ids: list[int] = []  # outputs so far (penalty counts after a retraction)


class BatchPlan(msgspec.Struct, **_WIRE):
    """One forward step, planned by the scheduler: only what is new since the last step.

    Per request i (in order): it owns `rows[i]`; KV positions [prefix_lens[i],
    prefix_lens[i] + extend_lens[i]) are computed this step. The worker's page table maps
    position p of a row to page `req_to_page[row, p // page_size]` (page size 1 in token
    mode: a page is a slot); `new_pages` lists, request by request, the pages these
    positions start (positions ceil(prefix / page_size) * page_size onwards), so a decode
    in paged mode usually sends none. `prefix_writes` fills the front of a row with the
    pages of its cached prefix after a prefix hit. `input_ids` holds the new tokens; a
    negative id -(row+1) is a future token: the one the worker last sampled for that
    row. Requests with `sample[i]` produce one token each, in order, in
    StepResult.next_ids.
    """

    batch_id: int
    rows: list[int]
    prefix_lens: list[int]
    extend_lens: list[int]
    input_ids: list[int]
    new_pages: list[int]
    sample: list[bool]
    inits: list[RowInit] = []
    prefix_writes: list[tuple[int, list[int]]] = []  # (row, pages of positions 0..n-1)
    # (request index i, first position p, targets): return log_softmax(logits at positions
    # p, p+1, ...) of request i gathered at `targets` (the prompt tokens that follow them);
    # these positions lie inside request i's new tokens of this step
    input_logprobs: list[tuple[int, int, list[int]]] = []
    # KV copies with the host tier (`--host-kv-gib`), run before this step's forward in
    # this order: device slot writeback_dev[i] -> host slot writeback_host[i], then host
    # slot load_host[i] -> device slot load_dev[i]
    writeback_dev: list[int] = []
    writeback_host: list[int] = []
    load_host: list[int] = []
    load_dev: list[int] = []
    # LoRA: the adapter slot of each request (in order; -1: none), empty when no request
    # has one; `lora_loads` (slot, adapter name) are copied into their slots first
    lora_slots: list[int] = []
    lora_loads: list[tuple[int, str]] = []


class GrammarCacheUpdate(msgspec.Struct, **_WIRE):
    """Change the workers' compiled-grammar cache (every TP rank): drop the grammars of
    `evict`, then start compiling those of `compile`; each rank answers every grammar of
    `compile` with one `GrammarCompiled`, once it is ready or has failed. A grammar is
    named by its key, `SamplingParams.grammar`."""

    compile: list[str] = []
    evict: list[str] = []


# ---------------------------------------------------------------- worker -> scheduler
class WorkerReady(msgspec.Struct, **_WIRE):
    kv_slots: int
    max_rows: int
    max_context: int
    kv_bytes_per_token: int
    device: str
    kv_dtype: str = ""  # the KV storage: fp8, int8, or the model's dtype (bfloat16, ...)
    quantization: str = "none"  # the projections' weights: none or fp8
    host_kv_slots: int = 0  # slots of the host tier (`--host-kv-gib`); 0: none


class StepResult(msgspec.Struct, **_WIRE):
    """A step's sampled ids, and what its requests asked for beside them.

    Top alternatives come `top_stride` per scored token (the most asked for by a request
    of the step; a request asking k uses the first k): in `top_*`, for each sampled
    request whose `SamplingParams.top_logprobs` > 0, in order; in `input_top_*`, for each
    input logprob of the `input_logprobs` entries whose request asked, in order."""

    batch_id: int
    next_ids: list[int]
    logprobs: list[float]  # one per next_id, or none when no request of the step asked
    input_logprobs: list[list[float]] = []  # one list per BatchPlan.input_logprobs entry
    top_stride: int = 0
    top_ids: list[int] = []
    top_logprobs: list[float] = []
    input_top_ids: list[int] = []
    input_top_logprobs: list[float] = []
    writeback_s: float = 0.0  # device time of the plan's write-backs (host tier)
    load_s: float = 0.0  # device time of the plan's loads (host tier)


class WorkerFailed(msgspec.Struct, **_WIRE):
    batch_id: int
    error: str


class GrammarCompiled(msgspec.Struct, **_WIRE):
    """TP rank `rank` finished compiling grammar `key` (a `GrammarCacheUpdate.compile`
    entry): a row may now use it without waiting, or, with `error`, it failed."""

    key: str
    rank: int = 0
    error: str | None = None


# ---------------------------------------------------------------- readiness
class Ready(msgspec.Struct, **_WIRE):
    name: str
    info: dict[str, str] = {}
    error: str | None = None


# ---------------------------------------------------------------- RPC (client <-> api)
class RpcGenerate(msgspec.Struct, **_WIRE):
    rid: str
    prompt: str | list[int]
    params: SamplingParams
    stream: bool = True
    api_key: str = ""  # the server's `--api-key`, when it has one


class RpcAbort(msgspec.Struct, **_WIRE):
    rid: str


class RpcGetModelInfo(msgspec.Struct, **_WIRE):
    """Ask for the served model's `ModelInfo` (answered with `RpcModelInfo`)."""

    rid: str
    api_key: str = ""  # the server's `--api-key`, when it has one


class RequestOutput(msgspec.Struct, kw_only=True, **_WIRE):
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


class RpcBatch(msgspec.Struct, **_WIRE):
    """Several requests' outputs to one client, sent together (those of one scheduler step)."""

    outputs: list[RequestOutput]


class RpcModelInfo(msgspec.Struct, **_WIRE):
    rid: str
    info: ModelInfo
    max_message_bytes: int = 0  # the largest message the server reads (0: not said)


class RpcError(msgspec.Struct, **_WIRE):
    rid: str
    message: str
    # "invalid_request" | "overloaded" | "server_error" | "unauthorized"
    kind: str = "invalid_request"


# ---------------------------------------------------------------- model info (HTTP and RPC)
class RoleMarkers(msgspec.Struct, kw_only=True):
    """Text around one chat message of a role, as the model's chat template renders it.

    A conversation renders as, per message, (`first_prefix` for the first message, else
    `prefix`) + content + `suffix`; the assistant's `prefix` is the generation prompt.
    `first_prefix` holds what the template puts before a conversation that starts with
    this role (a BOS token, a default system message).
    """

    first_prefix: str
    prefix: str
    suffix: str


class ModelInfo(msgspec.Struct, kw_only=True):
    """What a client needs to know about the served model."""

    model: str
    max_model_len: int
    chat_roles: dict[str, RoleMarkers] = {}  # "system" | "user" | "assistant"; {}: no template
    quantization: str = "none"  # the projections' weights: none or fp8
    kv_dtype: str = ""  # the KV storage: fp8, int8, or the model's dtype (bfloat16, ...)
    # what requests get for the sampling fields they leave unset (generation_config.json)
    default_sampling_params: dict[str, int | float] = {}


SchedulerInput = GenerateReq | AbortReq | FinishReq | GetStats | Shutdown | FlushCache
ApiInput = BatchOut | SchedulerStats | ProcessDied | Limits | CacheFlushed
WorkerInput = BatchPlan | GrammarCacheUpdate | Shutdown
WorkerOutput = StepResult | WorkerReady | WorkerFailed | GrammarCompiled
RpcInput = RpcGenerate | RpcAbort | RpcGetModelInfo
RpcOutput = RequestOutput | RpcBatch | RpcError | RpcModelInfo
