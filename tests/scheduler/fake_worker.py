"""A worker that runs BatchPlans on token ids instead of a model.

The "KV" of a slot is the token id written there; a sampled token (and an input
logprob) is a hash of the whole sequence read back through the request's slots. Any
scheduling bug that points a request at the wrong slots, loses a prefix or mixes up
placeholders changes the output.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from runtime.wire.sampling import SamplingParams
from runtime.wire.scheduler_input import GenerateReq
from runtime.wire.worker_channel import BatchPlan, StepResult

VOCAB = 97
EOS = 0


def next_token(seq: list[int] | np.ndarray) -> int:
    h = 7
    for tok in seq:
        h = (h * 1000003 + int(tok) + 1) % 2_147_483_647
    return h % VOCAB


def input_logprob(prefix: list[int] | np.ndarray, token: int) -> float:
    """A fake logprob of `token` after `prefix`: depends on every token of both."""
    return -float((next_token(prefix) * 131 + int(token)) % 997)


def reference_input_logprobs(prompt: list[int], start: int) -> list[float]:
    """What the fake worker returns for prompt tokens from max(start, 1) on."""
    return [input_logprob(prompt[:q], prompt[q]) for q in range(max(start, 1), len(prompt))]


def reference(prompt: list[int], max_tokens: int, stop_ids: set[int]) -> list[int]:
    seq, out = list(prompt), []
    while len(out) < max_tokens:
        tok = next_token(seq)
        out.append(tok)
        seq.append(tok)
        if tok in stop_ids:
            break
    return out


class FakeWorker:
    """Keeps a page table per row, as the worker does: position p of a row lives in slot
    page * page_size + p % page_size of page `req_to_page[row, p // page_size]`. A host
    tier of `host_slots` is a second array the plans' copy orders move tokens through."""

    def __init__(self, num_slots: int, rows: int, max_context: int, page_size: int = 1,
                 host_slots: int = 0) -> None:
        self.page_size = page_size
        self.kv = np.full(num_slots + 1, -1, dtype=np.int64)
        self.host_kv = np.full(host_slots + 1, -1, dtype=np.int64)
        self.req_to_page = np.zeros((rows, -(-max_context // page_size)), dtype=np.int64)
        self.last = np.zeros(rows, dtype=np.int64)

    def slot(self, row: int, pos: int) -> int:
        ps = self.page_size
        return int(self.req_to_page[row, pos // ps]) * ps + pos % ps

    def seq(self, row: int, n: int) -> np.ndarray:
        """The token ids stored for the first `n` positions of `row`."""
        return self.kv[[self.slot(row, p) for p in range(n)]]

    def run(self, plan: BatchPlan) -> StepResult:
        ps = self.page_size
        self.host_kv[plan.writeback_host] = self.kv[plan.writeback_dev]  # before the loads
        self.kv[plan.load_dev] = self.host_kv[plan.load_host]
        for row, pages in plan.prefix_writes:
            self.req_to_page[row, : len(pages)] = pages
        t, out, pages = 0, [], iter(plan.new_pages)
        for i, row in enumerate(plan.rows):
            p, e = plan.prefix_lens[i], plan.extend_lens[i]
            for page in range(-(-p // ps), -(-(p + e) // ps)):  # pages these positions start
                self.req_to_page[row, page] = next(pages)
            for j in range(e):
                tok = plan.input_ids[t]
                if tok < 0:
                    tok = self.last[-tok - 1]
                slot = self.slot(row, p + j)
                assert slot >= ps, "page 0 holds the padding sink"
                self.kv[slot] = tok
                t += 1
            if plan.sample[i]:
                tok = next_token(self.seq(row, p + e))
                self.last[row] = tok
                out.append(tok)
        assert next(pages, None) is None, "more new pages than the plan's positions start"
        inputs = []
        for i, first, targets in plan.input_logprobs:
            row, p, e = plan.rows[i], plan.prefix_lens[i], plan.extend_lens[i]
            assert p <= first and first + len(targets) <= p + e, "not computed this step"
            inputs.append([input_logprob(self.seq(row, pos + 1), t)
                           for pos, t in enumerate(targets, start=first)])
        return StepResult(plan.batch_id, out, [0.0] * len(out), inputs)


def drive(sched, worker: FakeWorker, on_step=None, check=True) -> None:
    """Run the scheduler to completion; batches execute lazily, as on a device."""
    launched: deque[BatchPlan] = deque()
    steps = 0
    while sched.has_work or launched:
        while sched.can_plan():
            plan = sched.plan()
            if plan is None:
                break
            launched.append(plan)
        assert launched, "scheduler stalled with work left"
        sched.on_result(worker.run(launched.popleft()))
        steps += 1
        if on_step is not None:
            on_step(sched, steps)
        if check and not sched.in_flight:
            sched.check_invariants()


def make_req(rid: str, prompt: list[int], max_tokens: int, **kw) -> GenerateReq:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, **kw)
    return GenerateReq(rid=rid, input_ids=prompt, params=params, stop_ids=[EOS])
