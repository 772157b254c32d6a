"""`Scheduler`: continuous batching with chunked prefill, retraction and delayed KV release.

Pure state machine, no sockets: `add`/`abort`/`finish` take requests, `plan` builds the next step,
`on_result` consumes the oldest step's sampled tokens, `take_batch` drains what the api
must stream. A request with a grammar (regex or JSON schema) waits in `grammars` until
the workers compiled it: `take_grammar_update` says what they must compile,
`on_grammar_compiled` takes their answers. Arrivals and the degraded mode are
`Admission`'s (`admission.py`), a request's end and its KV's delayed release `Release`'s
(`release.py`), the outputs `Outbox`'s (`outbox.py`).
The process loop (`loop.py`) and in-process tests drive it the same way.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable

from runtime.scheduler.admission import Admission
from runtime.scheduler.batch import Batch, split_top
from runtime.scheduler.grammar_gate import GrammarGate
from runtime.scheduler.kv_manager import KVManager
from runtime.scheduler.lora_slots import LoraSlots
from runtime.scheduler.outbox import Outbox
from runtime.scheduler.policy import PrefillAdder, retract_order
from runtime.scheduler.release import Release
from runtime.scheduler.req import Req
from runtime.scheduler.speculative.speculation import Speculation
from runtime.wire.request_output import FinishReason
from runtime.wire.worker_channel import BatchPlan, GrammarCacheUpdate, GrammarCompiled, StepResult


class Scheduler(Admission, Release, Outbox):
    """Owns every request's KV metadata; never touches tensors."""

    def __init__(self, kv: KVManager, *, chunk_size: int, max_running: int, max_context: int,
                 max_in_flight: int = 2, retract_headroom: int = 4,
                 retract_key: Callable[[Req], tuple] = retract_order, degrade_waiting: int = 0,
                 degrade_max_tokens: int = 128, degrade_max_running: int = 0,
                 swap: bool = False) -> None:
        self.kv = kv
        self.chunk_size = chunk_size
        Admission.__init__(self, max_running=max_running, max_context=max_context,
                           degrade_waiting=degrade_waiting,
                           degrade_max_tokens=degrade_max_tokens,
                           degrade_max_running=degrade_max_running)
        self.max_in_flight = max_in_flight
        self.retract_headroom = retract_headroom
        self.retract_key = retract_key  # sorts victims, first retracted first
        # a retracted request's KV goes to the host tier (`--preempt swap`), not away
        self.swap = swap and kv.host is not None
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.reqs: dict[str, Req] = {}
        self.in_flight: deque[Batch] = deque()
        Release.__init__(self)
        Outbox.__init__(self)
        self.next_batch_id = 0
        self.adder = PrefillAdder()
        self.grammars = GrammarGate()
        self.loras = LoraSlots()  # the LoRA adapters' device slots (none by default)
        self.spec: Speculation | None = None  # speculative decoding (off by default)
        self.num_retractions = 0
        self.num_swaps = 0
        self.num_steps = 0
        self.writeback_seconds = 0.0  # device time of the host tier's copies so far
        self.load_seconds = 0.0

    # ------------------------------------------------------------------ cache
    def flush_cache(self) -> tuple[bool, str, int]:
        """Drop every cached prefix, unless requests wait or run:
        `(ok, message, slots freed)`. Flushing needs no batch in flight, so that finished
        requests have given their KV back to the cache first."""
        if self.has_work or self.grammars.held:
            return False, (f"not flushed: {len(self.running)} requests running and "
                           f"{self.num_waiting} waiting"), 0
        assert not self.in_flight, "flush the cache only between batches"
        freed = self.kv.flush_cache()
        return True, f"flushed {freed} cached tokens", freed

    # ------------------------------------------------------------------ grammars
    def take_grammar_update(self) -> GrammarCacheUpdate | None:
        """What every worker must compile or evict now (None: nothing); send it before
        the next plan."""
        return self.grammars.take_update(self.waiting)

    def on_grammar_compiled(self, msg: GrammarCompiled) -> None:
        """A worker's report of a compile: once every rank has one, the requests waiting
        for that grammar join the queue, or finish with the compiler's error."""
        released, error = self.grammars.on_compiled(msg)
        for req in released:
            if error is None:
                self.waiting.append(req)
                continue
            req.finish(FinishReason.ERROR)
            self._emit(req, error=error)
            self._drop(req)

    # ------------------------------------------------------------------ planning
    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def can_plan(self) -> bool:
        """Room for another batch in flight (none after one with a request whose drafter
        needs its result: the tokens it drafts from)."""
        return (len(self.in_flight) < self.max_in_flight and self.has_work
                and not (self.in_flight and self.in_flight[-1].speculative))

    def plan(self) -> BatchPlan | None:
        """The next step, or None (nothing to run, or retraction must wait for a drain)."""
        self.running = [r for r in self.running if not r.finished]
        decode, last_prompt = [], []
        for r in self.running:
            if r.in_prefill:
                continue
            if r.remaining_tokens > 0:
                # a drafter on the host needs the whole sequence; one on the device chains
                if r.drafter is None or not r.pending or self.spec.chains:
                    decode.append(r)
            elif r.prefill_only and r.kv_len < r.known_len:
                # a prefill-only request whose last chunk left one position
                last_prompt.append(r)
        if not self._reserve_decode(decode, last_prompt):
            return None
        verify = self.spec.take_verifies(decode, self.kv) if self.spec is not None else []
        batch = Batch(self.next_batch_id, decode=decode)
        decode_pages = self.kv.alloc_decode(decode)
        extend_pages = []
        for req, drafts in verify:
            extend_pages.append(self.kv.try_alloc(req, len(drafts) + 1))
            batch.add_verify(req, drafts)
        for req in last_prompt:
            extend_pages.append(self.kv.try_alloc(req, 1))
            batch.add(req, 1)
        budget = self.chunk_size - len(decode) - len(last_prompt)
        for req, n in self.adder.fill(budget, running=self.running, waiting=self.waiting,
                                      max_running=self.max_running, kv=self.kv,
                                      loras=self.loras):
            if req.scheduled_at is None:
                req.scheduled_at = time.monotonic()
            pages = self.kv.try_alloc(req, n)
            assert pages is not None, "PrefillAdder admitted more than the pool holds"
            extend_pages.append(pages)
            batch.add(req, n)
        if not batch.decode and not batch.extend:
            return None
        self.next_batch_id += 1
        self.num_steps += 1
        batch.speculative = (self.spec is not None and not self.spec.chains
                             and any(r.drafter for r in batch.reqs))
        plan = batch.to_plan(decode_pages, extend_pages)
        plan.lora_slots, plan.lora_loads = self.loras.slots_of(batch.reqs), self.loras.take_loads()
        if (copies := self.kv.take_copies()) is not None:
            plan.writeback_dev, plan.writeback_host = (copies.writeback_dev.tolist(),
                                                       copies.writeback_host.tolist())
            plan.load_host, plan.load_dev = copies.load_host.tolist(), copies.load_dev.tolist()
            plan.entry_writeback = [(m, d.tolist(), h.tolist())
                                    for m, (d, h) in copies.entry_writeback.items()]
            plan.entry_load = [(m, h.tolist(), d.tolist())
                               for m, (h, d) in copies.entry_load.items()]
        self.in_flight.append(batch)
        return plan

    def _reserve_decode(self, decode: list[Req], last_prompt: list[Req]) -> bool:
        """Make room for one token per request of `decode` and `last_prompt`, retracting if
        the pool is full (both lists lose their victims).

        Victims are any running requests, chunked prefills included (they may hold the KV
        the decodes need); the last one is never retracted.
        """
        kv = self.kv
        if kv.can_decode(decode + last_prompt if last_prompt else decode):
            return True
        if self.in_flight:
            return False  # retract only when no batch in flight references a victim
        victims = sorted(self.running, key=self.retract_key)
        while len(victims) > 1 and not kv.can_decode(
                decode + last_prompt, self.retract_headroom * (len(decode) + len(last_prompt))):
            victim = victims.pop(0)
            for group in (decode, last_prompt):
                if victim in group:
                    group.remove(victim)
            self._retract(victim)
        if kv.can_decode(decode + last_prompt):
            return True
        for req in decode + last_prompt:  # a single request longer than the whole pool
            req.finish(FinishReason.ERROR)
            self._emit(req, error="request does not fit in the KV pool")
            self._finish_running(req)
        decode.clear()
        last_prompt.clear()
        return True

    def _retract(self, req: Req) -> None:
        """Back to the queue; with `swap` its KV goes to the host tier when possible."""
        if self.swap and self.kv.swap_out(req):
            self.num_swaps += 1
        else:
            self.kv.release(req, cache=False)
        self.loras.release(req)
        self.running.remove(req)
        req.retract()
        if self.grammars.admissible(req):  # its grammar may have left the cache meanwhile
            self.waiting.insert(0, req)
        self.num_retractions += 1
        self.adder.on_retract()

    # ------------------------------------------------------------------ results
    def on_result(self, res: StepResult) -> None:
        batch = self.in_flight.popleft()
        assert batch.batch_id == res.batch_id, (batch.batch_id, res.batch_id)
        assert len(res.next_ids) == len(batch.sampled) + batch.num_drafts
        self.completed_batch_id = batch.batch_id
        self.writeback_seconds += res.writeback_s
        self.load_seconds += res.load_s
        input_tops = split_top(batch.logprob_reqs, map(len, res.input_logprobs),
                               res.input_top_ids, res.input_top_logprobs, res.top_stride)
        for req, lps, (top_ids, top_lps) in zip(batch.logprob_reqs, res.input_logprobs,
                                                input_tops):
            req.input_logprobs.extend(lps)
            req.input_top_ids.extend(top_ids)
            req.input_top_logprobs.extend(top_lps)
        for req in batch.prefilled:
            if not req.finished:
                req.finish(FinishReason.LENGTH)
                self._emit(req)
                self._finish_running(req)
        ids = iter(res.next_ids)
        lps = iter(res.logprobs or itertools.repeat(0.0))  # empty: no request asked for them
        tops = split_top(batch.sampled, itertools.repeat(1), res.top_ids, res.top_logprobs,
                         res.top_stride)
        drafted = iter(res.draft_ids)  # a draft model's drafts, in verify order
        for req, top, d in zip(batch.sampled, tops, batch.sampled_drafts):
            if d:  # a verify step: one sample per position
                n = d + 1
                finished = req.finished
                self.spec.settle(req, [*itertools.islice(ids, n)],
                                 [*itertools.islice(lps, n)], self.kv,
                                 [*itertools.islice(drafted, n - 1)])
                if finished:
                    continue
            elif req.finished:  # sampled by a batch planned before it finished: discarded
                req.pending -= 1
                next(ids), next(lps)
                continue
            else:
                req.append_output(next(ids), next(lps), *top)
            self._emit(req)
            if req.finished:
                self._finish_running(req)
        self._release_deferred()

    def fail_in_flight(self, message: str) -> None:
        """The worker failed a step: every request in it ends with an error."""
        batch = self.in_flight.popleft()
        self.completed_batch_id = batch.batch_id
        for req in batch.reqs:
            if not req.finished:
                req.finish(FinishReason.ERROR)
                self._emit(req, error=message)
                self._finish_running(req)
        self._release_deferred()

    # ------------------------------------------------------------------ checks
    def check_invariants(self) -> None:
        live = [r for r in list(self.running) + self.deferred if r.row is not None]
        self.kv.check_invariants(live)
        self.loras.check_invariants(live)
