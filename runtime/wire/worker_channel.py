"""scheduler <-> worker: step plans one way (`WorkerInput`), step results the other
(`WorkerOutput`)."""

from __future__ import annotations

from runtime.wire.lifecycle import Shutdown
from runtime.wire.record import WireRecord
from runtime.wire.sampling import SamplingParams


class RowInit(WireRecord):
    """Bind a request to a row of the worker's tables (on admission or re-admission)."""

    row: int
    params: SamplingParams
    prompt_ids: list[int] = []  # only when repetition_penalty != 1
    output_ids: list[int] = []  # outputs so far (penalty counts after a retraction)


class BatchPlan(WireRecord):
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
    StepResult.next_ids; a verify step (speculative decoding, `draft_lens[i]` = d > 0:
    its last d new tokens are drafts) produces d + 1, the target's sample at each of its
    last d + 1 positions. With a draft model (`--speculative-algorithm draft`) the
    worker writes the drafts itself in the same step (the plan's ids there are
    placeholders) and returns them in StepResult.draft_ids. `draft_backfill[i]` >= 0 is
    a token whose draft KV request i still owes, at position prefix_lens[i] - 1: the last
    draft of its previous verify step, all of whose drafts were accepted (the worker
    feeds it to the draft model in front of the request's tokens of this step).
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
    # and the compressed entries of the slots they copy (`WorkerReady.host_entry_ids`), by
    # rate: (rate, device ids, host ids) written back, (rate, host ids, device ids) loaded
    entry_writeback: list[tuple[int, list[int], list[int]]] = []
    entry_load: list[tuple[int, list[int], list[int]]] = []
    # LoRA: the adapter slot of each request (in order; -1: none), empty when no request
    # has one; `lora_loads` (slot, adapter name) are copied into their slots first
    lora_slots: list[int] = []
    lora_loads: list[tuple[int, str]] = []
    # speculative decoding: draft tokens at the end of each request's new tokens (in
    # order), empty when no request of the step verifies drafts
    draft_lens: list[int] = []
    # a draft model: per request (in order), the token owed at position prefix_lens[i] - 1
    # or -1, empty when no request of the step owes one
    draft_backfill: list[int] = []
    # verify steps planned behind a verify step of the same request still in flight: per
    # request (in order), that step's drafts d (0: not such a step), empty when none. Its
    # positions are planned as if all d were accepted; the worker moves them back by the
    # d - m drafts the target rejected there (m: kept, known on the device only), and feeds
    # a draft model the token at the moved prefix_lens[i] - 1 in front (`chained`)
    chain_back: list[int] = []
    # compressed-entry ids handed out (`WorkerReady.entry_ids`), run before the forward:
    # (rate, row, first window w, ids): window w + j of the request on `row` has ids[j]
    entry_writes: list[tuple[int, int, int, list[int]]] = []


class GrammarCacheUpdate(WireRecord):
    """Change the workers' compiled-grammar cache (every TP rank): drop the grammars of
    `evict`, then start compiling those of `compile`; each rank answers every grammar of
    `compile` with one `GrammarCompiled`, once it is ready or has failed. A grammar is
    named by its key, `SamplingParams.grammar`."""

    compile: list[str] = []
    evict: list[str] = []


class WorkerReady(WireRecord):
    kv_slots: int
    max_rows: int
    max_context: int
    kv_bytes_per_token: int
    device: str
    kv_dtype: str = ""  # the KV storage: fp8, int8, or the model's dtype (bfloat16, ...)
    quantization: str = "none"  # the projections' weights: none or fp8
    host_kv_slots: int = 0  # slots of the host tier (`--host-kv-gib`); 0: none
    # prefix hits are rounded down to a multiple of `prefix_align`, and their last
    # `prefix_replay` tokens computed again (the model rebuilds state outside the pool)
    prefix_align: int = 1
    prefix_replay: int = 0
    # by compression rate m: ids 1..n of entries of m tokens (DeepSeek-V4's compressed
    # windows) the scheduler hands out, one with the slot of each position closing a window
    # ((p + 1) % m == 0), sent in `BatchPlan.entry_writes`; empty: none to hand out
    entry_ids: dict[int, int] = {}
    # by rate: host entry ids of the host tier's slots (one a window of its slots), whose
    # entries its copies carry with the slots (any layout); empty: none
    host_entry_ids: dict[int, int] = {}


class StepResult(WireRecord):
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
    # the drafts a draft model wrote for the plan's verify requests: draft_lens[i] per
    # request, in order (empty without a draft model)
    draft_ids: list[int] = []
    writeback_s: float = 0.0  # device time of the plan's write-backs (host tier)
    load_s: float = 0.0  # device time of the plan's loads (host tier)


class WorkerFailed(WireRecord):
    batch_id: int
    error: str


class GrammarCompiled(WireRecord):
    """TP rank `rank` finished compiling grammar `key` (a `GrammarCacheUpdate.compile`
    entry): a row may now use it without waiting, or, with `error`, it failed."""

    key: str
    rank: int = 0
    error: str | None = None


WorkerInput = BatchPlan | GrammarCacheUpdate | Shutdown
WorkerOutput = StepResult | WorkerReady | WorkerFailed | GrammarCompiled
