"""`Batch`: the scheduler's record of one planned step, and its wire form (`BatchPlan`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from runtime.messages import BatchPlan, RowInit
from runtime.scheduler.req import Req


@dataclass
class Batch:
    """Requests of one step, each with the number of new tokens it computes."""

    batch_id: int
    reqs: list[Req] = field(default_factory=list)
    extend_lens: list[int] = field(default_factory=list)
    sampled: list[Req] = field(default_factory=list)
    logprob_reqs: list[Req] = field(default_factory=list)  # per BatchPlan.input_logprobs entry
    prefilled: list[Req] = field(default_factory=list)  # prefill-only requests done this step
    num_prefill_tokens: int = 0

    def add(self, req: Req, n: int) -> None:
        self.reqs.append(req)
        self.extend_lens.append(n)

    @property
    def num_tokens(self) -> int:
        return sum(self.extend_lens)

    def to_plan(self, new_slots: list[np.ndarray]) -> BatchPlan:
        """Advance each request's KV and pending counts and describe the step for the worker."""
        rows, prefix_lens, input_ids, sample = [], [], [], []
        inits, prefix_writes, logprob_targets = [], [], []
        for i, (req, n) in enumerate(zip(self.reqs, self.extend_lens)):
            if req.needs_init:
                inits.append(_row_init(req))
                req.needs_init = False
            if req.cached_len and not req.prefix_written:
                prefix_writes.append((req.row, req.slots[:req.cached_len].tolist()))
            req.prefix_written = True
            start = req.kv_len
            rows.append(req.row)
            prefix_lens.append(start)
            known = min(start + n, req.known_len)
            input_ids.extend(req.tokens(start, known))
            # a position past the known tokens holds the token the worker last sampled
            input_ids.extend([-(req.row + 1)] * (start + n - known))
            if (targets := req.take_logprob_targets(start, start + n)) is not None:
                logprob_targets.append((i, *targets))
                self.logprob_reqs.append(req)
            req.kv_len = start + n
            req.last_batch_id = self.batch_id
            complete = req.kv_len == req.total_len
            does_sample = complete and not req.prefill_only
            sample.append(does_sample)
            if does_sample:
                req.pending += 1
                self.sampled.append(req)
            elif complete:
                self.prefilled.append(req)
        slots = np.concatenate(new_slots) if new_slots else np.zeros(0, np.int32)
        return BatchPlan(
            batch_id=self.batch_id, rows=rows, prefix_lens=prefix_lens,
            extend_lens=list(self.extend_lens), input_ids=input_ids,
            new_slots=slots.tolist(), sample=sample, inits=inits, prefix_writes=prefix_writes,
            input_logprobs=logprob_targets,
        )


def _row_init(req: Req) -> RowInit:
    p = req.params
    return RowInit(
        row=req.row, params=p,
        prompt_ids=req.prompt_ids if p.repetition_penalty != 1.0 else [],
        # penalty counts and a regex matcher replay the outputs after a retraction
        output_ids=list(req.output_ids) if p.uses_penalties or p.regex is not None else [],
    )
