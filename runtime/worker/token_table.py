"""`TokenTable`: the worker's mirror of request rows: KV slots per position and future tokens."""

from __future__ import annotations

import itertools

import torch

from runtime.messages import BatchPlan
from runtime.worker.forward_batch import ForwardBatch


class TokenTable:
    """Device-side state that turns a BatchPlan into a ForwardBatch without host syncs.

    `req_to_token[row, pos]` is the pool slot of position `pos` of the request bound to
    `row` (written from the plan's prefix writes and new slots). `last_ids[row]` is the
    token last sampled for that row: plans refer to it with placeholder id -(row + 1)
    when the scheduler has not seen it yet (overlap). Reads happen in stream order after
    the write of the previous batch, so no synchronisation is needed.

    With `page_size` > 1 (`--kv paged`, whose block b holds slots b * page_size onwards)
    the ForwardBatch lists one page id per block, read off each block's first position.
    """

    def __init__(self, max_rows: int, max_context: int, device: torch.device,
                 page_size: int = 1) -> None:
        self.device = device
        self.page_size = page_size
        self.req_to_token = torch.zeros(max_rows, max_context, dtype=torch.int64, device=device)
        self.last_ids = torch.zeros(max_rows, dtype=torch.int64, device=device)

    def _tensor(self, values: list[int]) -> torch.Tensor:
        host = torch.tensor(values, dtype=torch.int64)
        if self.device.type == "cuda":
            return host.pin_memory().to(self.device, non_blocking=True)
        return host

    def build(self, plan: BatchPlan) -> ForwardBatch:
        """Write the plan's slots into the table and gather the step's indices."""
        for row, slots in plan.prefix_writes:
            self.req_to_token[row, : len(slots)] = self._tensor(slots)
        ext, pre, ps = plan.extend_lens, plan.prefix_lens, self.page_size
        seq = [p + e for p, e in zip(pre, ext)]
        pages = [-(-s // ps) for s in seq]
        n_tok = sum(ext)
        rows = self._tensor(plan.rows)  # [B]
        ext_t = self._tensor(ext)  # [B]
        seq_t = self._tensor(seq)  # [B]
        pre_t = self._tensor(pre)  # [B]
        pages_t = self._tensor(pages)  # [B]
        qo_indptr = _indptr(ext_t)  # [B+1]
        kv_indptr = _indptr(pages_t)  # [B+1]
        # new tokens: position = prefix + offset inside the sequence's chunk
        tok_row = torch.repeat_interleave(rows, ext_t, output_size=n_tok)  # [T]
        tok_seq_start = torch.repeat_interleave(qo_indptr[:-1], ext_t, output_size=n_tok)
        positions = torch.repeat_interleave(pre_t, ext_t, output_size=n_tok) + (
            torch.arange(n_tok, device=self.device) - tok_seq_start)  # [T]
        out_slots = self._tensor(plan.new_slots)  # [T]
        self.req_to_token[tok_row, positions] = out_slots
        ids = self._tensor(plan.input_ids)  # [T], negative = future token of row -(id+1)
        future = self.last_ids[(-ids - 1).clamp(min=0)]
        input_ids = torch.where(ids < 0, future, ids)
        # every page of every sequence, prefix included, read at its first position
        n_pages = sum(pages)
        kv_row = torch.repeat_interleave(rows, pages_t, output_size=n_pages)  # [P]
        kv_page = torch.arange(n_pages, device=self.device) - torch.repeat_interleave(
            kv_indptr[:-1], pages_t, output_size=n_pages)  # [P]
        kv_indices = self.req_to_token[kv_row, kv_page * ps] // ps  # [P]
        ends = list(itertools.accumulate(ext))
        logit_rows = [e - 1 for e, s in zip(ends, plan.sample) if s]  # S sampled tokens
        for i, first, targets in plan.input_logprobs:  # then L input-logprob positions
            start = ends[i] - ext[i] + first - pre[i]
            logit_rows.extend(range(start, start + len(targets)))
        sample_idx = self._tensor(logit_rows)  # [S + L]
        return ForwardBatch(
            input_ids=input_ids, positions=positions, out_slots=out_slots,
            qo_indptr=qo_indptr.int(), kv_indptr=kv_indptr.int(), kv_indices=kv_indices,
            seq_lens=seq_t.int(), prefix_lens=pre_t.int(), sample_idx=sample_idx,
            # extra logit rows take the extend path (decode graphs return one row each)
            is_decode=all(e == 1 for e in ext) and not plan.input_logprobs,
            seq_lens_cpu=seq, prefix_lens_cpu=list(pre), extend_lens_cpu=list(ext),
            page_size=ps,
        )

    def logprob_targets(self, plan: BatchPlan) -> torch.Tensor:
        """The prompt tokens the L input-logprob positions score, in logit-row order: [L]."""
        return self._tensor([t for _, _, targets in plan.input_logprobs for t in targets])

    def sampled_rows(self, plan: BatchPlan) -> list[int]:
        return [r for r, s in zip(plan.rows, plan.sample) if s]

    def sampled_positions(self, plan: BatchPlan) -> list[int]:
        """Position of each sampled token in its sequence (its seed offset)."""
        return [p + e for p, e, s in zip(plan.prefix_lens, plan.extend_lens, plan.sample) if s]

    def record(self, rows: list[int], ids: torch.Tensor) -> None:
        """Remember the sampled ids as the rows' future tokens (stream-ordered)."""
        if rows:
            self.last_ids[self._tensor(rows)] = ids


def _indptr(lens: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(lens.shape[0] + 1, dtype=torch.int64, device=lens.device)
    torch.cumsum(lens, 0, out=out[1:])
    return out
