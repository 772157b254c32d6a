"""`Req`: one request's state inside the scheduler."""

from __future__ import annotations

import enum
import time
from collections import deque
from collections.abc import Sequence

import numpy as np

from runtime.wire.request_output import FinishReason
from runtime.wire.sampling import SamplingParams
from runtime.wire.scheduler_input import GenerateReq

_NO_SLOTS = np.zeros(0, dtype=np.int32)


class ReqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Req:
    """A request's tokens, KV positions and progress.

    Positions [0, kv_len) have KV scheduled (computed or in a batch in flight);
    `slots[:kv_len]` are their pool slots (page-size-1 managers), the first `cached_len`
    borrowed from the prefix cache. Tokens and slots only grow at the end, so a step
    costs what it adds, never the context length. `pending` counts tokens sampled by
    batches still in flight (0..2 with overlap): the full sequence is prompt + output +
    `pending` unknown tokens.
    """

    def __init__(self, msg: GenerateReq, arrival: float | None = None) -> None:
        self.rid = msg.rid
        self.prompt_ids: list[int] = list(msg.input_ids)
        self.token_ids: list[int] = list(self.prompt_ids)  # append-only: prompt, then outputs
        self.params: SamplingParams = msg.params
        self.stop_ids = frozenset(msg.stop_ids)
        # the LoRA adapter (None: the base model), which also names its prefix-cache space,
        # and the device slot it runs in while admitted (`LoraSlots`)
        self.lora: str | None = msg.params.lora
        self.lora_slot: int | None = None
        self.arrival = time.monotonic() if arrival is None else arrival
        self.scheduled_at: float | None = None  # first admission: the end of its queue time
        self.output_ids: list[int] = []
        self.logprobs: list[float] = []
        # `params.top_logprobs` alternatives per output token / input logprob, flat
        self.top_ids: list[int] = []
        self.top_logprobs: list[float] = []
        self.input_top_ids: list[int] = []
        self.input_top_logprobs: list[float] = []
        self.status = ReqStatus.WAITING
        self.finished = False  # status is FINISHED: set only by `finish`, read every step
        self.finish_reason: FinishReason | None = None
        self.silent_finish = False  # the api already told the client (stop string)
        self.sent = 0  # output ids already streamed to the api
        self.sent_header = False  # prompt/cached token counts sent
        self.retractions = 0
        n = len(self.prompt_ids)
        self.logprob_end = n - 1  # the last prompt position's logits sample the first output
        start = self.params.logprob_start_len
        # the first prompt token scored is max(start, 1): position 0 has no prefix
        self.logprob_next = min(max(start, 1), n) - 1 if start >= 0 else self.logprob_end
        self.input_logprobs: list[float] = []
        self.sent_input = 0  # input logprobs already sent to the api
        # speculative decoding: the request's drafter (None: it decodes token by token)
        # and the drafts of the verify step being planned (None: none)
        self.drafter = None
        self.drafts: list[int] | None = None
        self.recent_accepts: deque[int] = deque()  # drafts kept by its last drafting steps
        self._reset_kv()

    def _reset_kv(self) -> None:
        self.row: int | None = None
        self._slot_buf = _NO_SLOTS  # [capacity] int32, grown by doubling
        self.num_slots = 0  # positions with a slot: the front of `_slot_buf`
        self.prefix_pages: list[int] = []  # pages of the cached prefix (page size 1: slots)
        self.kv_len = 0
        self.cached_len = 0
        self.pending = 0
        self.needs_init = True  # the worker must (re)bind its row before the next forward
        self.last_batch_id = -1
        self.prefix_written = False
        # positions before kv_len its next step computes again, and the pages they start:
        # the last tokens of a prefix hit, when the model asks it (`KVManager.prefix_replay`)
        self.replay = 0
        self.replay_pages: list[int] = []
        # compressed-entry ids its next step sends the worker (`EntryIds`: rate, window, ids)
        self.entry_writes: list[tuple[int, int, list[int]]] = []
        # a draft model never wrote the draft KV of position kv_len - 1 (its last verify
        # step accepted every draft): its next step does (`BatchPlan.draft_backfill`)
        self.draft_kv_owed = False
        # its verify steps in flight, oldest first: [first position as planned, drafts]
        # (a step chained behind another starts earlier by the drafts that one rejects)
        self.verifies: deque[list] = deque()

    # ------------------------------------------------------------------ tokens
    @property
    def known_len(self) -> int:
        return len(self.token_ids)

    @property
    def total_len(self) -> int:
        return len(self.token_ids) + self.pending

    def tokens(self, start: int, end: int) -> list[int]:
        """Known tokens of positions [start, end): a copy of that range alone."""
        return self.token_ids[start:end]

    @property
    def max_prefix_len(self) -> int:
        """How many leading positions the prefix cache may serve: never the last known
        token (one must be computed), nor a position whose input logprob is still due."""
        if self.logprob_next >= self.logprob_end:  # none asked, or all delivered
            return self.known_len - 1
        return min(self.known_len - 1, self.logprob_next)

    @property
    def prefill_only(self) -> bool:
        """`max_tokens == 0`: compute the prompt's KV (and input logprobs), sample nothing."""
        return self.params.max_tokens == 0

    def take_logprob_targets(self, start: int, end: int) -> tuple[int, list[int]] | None:
        """For a step computing positions [start, end): the first position whose logits
        give input logprobs and the prompt tokens they score, or None. Advances
        `logprob_next` (the step is planned)."""
        first, last = max(start, self.logprob_next), min(end, self.logprob_end)
        if first >= last:
            return None
        assert first == self.logprob_next, (self, start, self.logprob_next)
        self.logprob_next = last
        return first, self.prompt_ids[first + 1:last + 1]

    @property
    def in_prefill(self) -> bool:
        """More than the last token lacks KV (fresh, chunked, or re-admitted request).

        A decoding request has KV for every token but the last (known or pending).
        """
        return self.kv_len < len(self.token_ids) + self.pending - 1  # total_len - 1

    @property
    def remaining_tokens(self) -> int:
        """Output tokens this request may still be asked to produce (beyond those in flight)."""
        return max(0, self.params.max_tokens - len(self.output_ids) - self.pending)

    # ------------------------------------------------------------------ slots
    @property
    def slots(self) -> np.ndarray:
        """Pool slots of positions [0, num_slots): a view, valid until the next change."""
        return self._slot_buf[:self.num_slots]

    @slots.setter
    def slots(self, value: np.ndarray | list[int]) -> None:
        self._slot_buf = np.array(value, dtype=np.int32)
        self.num_slots = len(self._slot_buf)

    def add_slots(self, slots: np.ndarray) -> None:
        """Append the slots of the next positions (amortized O(len(slots)))."""
        end = self.num_slots + len(slots)
        if end > len(self._slot_buf):
            self._grow(end)
        self._slot_buf[self.num_slots:end] = slots
        self.num_slots = end

    def add_slot(self, slot: int) -> None:
        """Append the slot of the next position."""
        if self.num_slots == len(self._slot_buf):
            self._grow(self.num_slots + 1)
        self._slot_buf[self.num_slots] = slot
        self.num_slots += 1

    def _grow(self, need: int) -> None:
        buf = np.empty(max(need, 2 * len(self._slot_buf), 16), dtype=np.int32)
        buf[:self.num_slots] = self._slot_buf[:self.num_slots]
        self._slot_buf = buf

    # ------------------------------------------------------------------ results
    def append_output(self, token_id: int, logprob: float, top_ids: Sequence[int] = (),
                      top_logprobs: Sequence[float] = ()) -> None:
        """Record one sampled token (and its top alternatives, if asked) and decide
        whether the request is done."""
        self.pending -= 1
        if self.finished:
            return  # sampled by a batch planned before it finished: discarded
        self._take(token_id, logprob, top_ids, top_logprobs)

    def append_outputs(self, token_ids: Sequence[int], logprobs: Sequence[float]) -> int:
        """Record the tokens one step produced for this request (a verify step's kept
        tokens, in order) up to the one that finishes it; returns how many were kept."""
        self.pending -= 1
        kept = 0
        for token_id, logprob in zip(token_ids, logprobs):
            if self.finished:
                break
            self._take(token_id, logprob)
            kept += 1
        return kept

    def _take(self, token_id: int, logprob: float, top_ids: Sequence[int] = (),
              top_logprobs: Sequence[float] = ()) -> None:
        self.output_ids.append(token_id)
        self.token_ids.append(token_id)
        self.logprobs.append(logprob)
        self.top_ids.extend(top_ids)
        self.top_logprobs.extend(top_logprobs)
        if token_id in self.stop_ids:
            self.finish(FinishReason.STOP)
        elif len(self.output_ids) >= self.params.max_tokens:
            self.finish(FinishReason.LENGTH)

    def finish(self, reason: FinishReason, *, silent: bool = False) -> None:
        if self.finish_reason is None:
            self.finish_reason = reason
            self.silent_finish = silent
        self.status = ReqStatus.FINISHED
        self.finished = True

    def unadmit(self) -> None:
        """Undo an admission that did not fit (its row and prefix lock were released)."""
        self._reset_kv()

    def retract(self) -> None:
        """Forget all KV (already freed by the caller); re-prefill prompt + outputs later."""
        self.retractions += 1
        self._reset_kv()
        self.status = ReqStatus.WAITING

    def __repr__(self) -> str:
        return (f"Req({self.rid}, prompt={len(self.prompt_ids)}, out={len(self.output_ids)}, "
                f"kv={self.kv_len}, pending={self.pending}, {self.status.value})")
