"""Verify steps chained behind a verify step in flight: their positions on the device.

With overlap the scheduler plans a request's next verify step while its previous one
still runs, before anyone on the host knows how many of that step's d drafts the target
keeps (m, 0 <= m <= d). It plans the step as if all were kept (`BatchPlan.chain_back` =
d): its positions, sequence lengths and pages are the most the step can need, and the
pages exist (the scheduler allocated them). The worker knows m on the device once the
previous step has sampled (`VerifyRecord`: per request row, m, the target's token after
the kept drafts, which the placeholder id of the row resolves to, and the input token
before it), and moves every position of the chained step back by d - m
(`chained_shift`); lengths, page counts and the page table's index ranges follow from
the positions (`shifted_layout`). The moved step writes its KV over the slots of the
rejected drafts, which hold the same positions, and the slots its worst case took beyond
them go back when the host learns m. Nothing waits for the device: the host arrays stay
upper bounds, which is all the attention's host-side sizing reads.
"""

from __future__ import annotations

import numpy as np
import torch

from runtime.wire.worker_channel import BatchPlan


def chained_shift(accepted: torch.Tensor, rows: torch.Tensor, back: torch.Tensor,
                  ) -> torch.Tensor:
    """Per request [B] int64: how far its positions move, `accepted[rows] - back` where
    `back` > 0 (a chained step behind `back` drafts), else 0."""
    return torch.where(back > 0, accepted[rows] - back, torch.zeros_like(back))


def shifted_layout(pre: torch.Tensor, seq: torch.Tensor, shift: torch.Tensor,
                   page_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                            torch.Tensor]:
    """Per attention sequence [A]: prefix and sequence lengths moved by `shift` [A]
    (int32), their pages [A] (int64) and the page table's offsets `kv_indptr` [A + 1]
    (int32); a sequence's pages are the first of its row, so the gather of them reads
    the moved ranges."""
    pre = (pre + shift).to(torch.int32)  # [A]
    seq = (seq + shift).to(torch.int32)  # [A]
    pages = torch.div(seq + (page_size - 1), page_size, rounding_mode="floor").long()  # [A]
    kv_indptr = torch.zeros(len(seq) + 1, dtype=torch.int32, device=seq.device)  # [A + 1]
    kv_indptr[1:] = pages.cumsum(0)
    return pre, seq, pages, kv_indptr


def request_of(lens: np.ndarray) -> np.ndarray:
    """The request index of each of `sum(lens)` items laid out request by request."""
    return np.repeat(np.arange(len(lens), dtype=np.int64), lens)


class VerifyRecord:
    """What a verify step leaves on the device per request row, for a step chained behind
    it: the drafts kept (`accepted`) and the input token before the target's next one
    (`prev_in`: the last kept input, whose draft KV a draft model may owe); the next token
    itself goes to the row's placeholder (`last_ids`)."""

    def __init__(self, max_rows: int, device: torch.device) -> None:
        self.accepted = torch.zeros(max_rows, dtype=torch.int64, device=device)  # [rows]
        self.prev_in = torch.zeros(max_rows, dtype=torch.int64, device=device)  # [rows]

    @staticmethod
    def arrays(plan: BatchPlan, first: np.ndarray, s_indptr: np.ndarray,
               ) -> dict[str, np.ndarray]:
        """Index arrays of the plan's verify requests [R], for `record`: their rows, each
        one's samples `v_samp` [R * (K + 1)] and drafts `v_draft` [R * K] (indices into
        the step's samples and tokens; K the most drafts of one, shorter rows repeat
        their last index and are masked by `v_ok`), and its last token `v_first` [R]."""
        lens = np.array(plan.draft_lens, dtype=np.int64)  # [B]
        verify = np.flatnonzero(lens)  # [R]
        d = lens[verify]  # [R]
        k = int(d.max())
        j = np.arange(k + 1)  # [K + 1]
        samp = s_indptr[verify][:, None] + np.minimum(j, d[:, None])  # [R, K + 1]
        draft = first[verify][:, None] + 1 + np.minimum(j[:k], d[:, None] - 1)  # [R, K]
        return {"v_rows": np.array(plan.rows, dtype=np.int64)[verify],
                "v_samp": samp.ravel(), "v_draft": draft.ravel(),
                "v_ok": (j[:k] < d[:, None]).astype(np.int64).ravel(),
                "v_first": first[verify]}

    def record(self, dev: dict[str, torch.Tensor], ids: torch.Tensor,
               input_ids: torch.Tensor, last_ids: torch.Tensor) -> None:
        """After a step with verify requests sampled `ids` [S] over its tokens
        `input_ids` [T] (drafts in place; `dev`: the upload of `arrays`): each verify
        row's kept drafts m, its token after them into `last_ids`, and the input before."""
        rows = dev["v_rows"]  # [R]
        n = len(rows)
        samples = ids[dev["v_samp"]].view(n, -1)  # [R, K + 1]
        drafts = input_ids[dev["v_draft"]].view(n, -1)  # [R, K]
        ok = (drafts == samples[:, :-1]) & (dev["v_ok"].view(n, -1) > 0)  # [R, K]
        m = ok.long().cumprod(1).sum(1)  # [R]
        self.accepted[rows] = m
        last_ids[rows] = samples.gather(1, m[:, None])[:, 0]
        self.prev_in[rows] = input_ids[dev["v_first"] + m]
