"""The compression windows a DeepSeek-V4 step closes, for every sequence at once: device
tensors built from the step's (`V4Step`), no host read and no loop a sequence, once a step
for each (rate, overlap) of its compressors.

A new token at position p closes window `p // m` when `(p + 1) % m == 0`, unless the
window's inputs start before its request's first computed position (a cached prefix's
window: its entry is in the entry pool). Its entry's inputs are positions from
`(w - overlap) * m` to p: those at or after its sequence's first new position are new
tokens of the step (`t - (p - position)`), the earlier ones are in the request row's ring
(`deepseek_v4_partial`), before position 0 none. A step of T tokens over B sequences closes
at most `min(T, T // m + B)` windows (each sequence one more than its whole windows), so
the lists have that many rows, the closing tokens first, then padding that lists nothing
and writes to the entry pools' sink id. Each window's entry goes to its id
(`EntryStore.closing_ids`).

After the entries, each new token's inputs go to its ring cell if it is one of its
sequence's last `length` positions (p >= p1 - length: what the next windows read, whatever
drafts a verify step keeps), else to the ring's sink.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.worker.models.deepseek_v4_partial import InputRing, first_window
from runtime.worker.models.deepseek_v4_state import V4Step


@dataclass(frozen=True)
class Closing:
    """A step's windows of one rate (`window_pool`'s lists) and its ring writes."""

    sources: torch.Tensor  # [E, S] int64: < T new token, T + c ring cell c, -1 none
    series: torch.Tensor  # [S] int64: the series input j reads (CSA: previous window's 0)
    starts: torch.Tensor  # [E] int64 first position of each window (its entry's rotation)
    ids: torch.Tensor  # [E] int64 entry-pool id of each window, 0 (the sink) for padding
    cells: torch.Tensor  # [T] int64 the ring cell of each new token's inputs (or the sink)


def closing_of(step: V4Step, rate: int, overlap: bool, ring: InputRing) -> Closing:
    """The step's `Closing` for compressors of `rate` (`overlap`: CSA), whose rings are
    laid out as `ring`; built once a step for all compressors of that form."""
    key = (rate, overlap)
    if key not in step.closing:
        step.closing[key] = _closing(step, rate, int(overlap), ring.length, ring.sink)
    return step.closing[key]


def _closing(step: V4Step, m: int, overlap: int, length: int, sink: int) -> Closing:
    pos = step.positions  # [T]
    T, device = pos.shape[0], pos.device
    window = pos // m  # [T]
    closes = ((pos + 1) % m == 0) & (window >= first_window(step.start, m, bool(overlap)))
    bound = min(T, T // m + step.num_seqs)
    rank = torch.where(closes, closes.cumsum(0) - 1, bound)  # [T]; bound: not closing
    token = torch.full((bound + 1,), -1, dtype=torch.int64, device=device)
    token = token.scatter(0, rank, torch.arange(T, device=device))[:bound]  # [E]
    listed, t = token >= 0, token.clamp(min=0)
    span = (1 + overlap) * m
    at = (window[t] - overlap)[:, None] * m + torch.arange(span, device=device)  # [E, S]
    new = at >= step.p0[t][:, None]
    cell = step.rows[t][:, None] * length + at % length
    sources = torch.where(new, t[:, None] + at - pos[t][:, None], T + cell)
    sources = torch.where(listed[:, None] & (at >= 0), sources, -1)
    ids = step.entries.closing_ids(m, step.rows[t], window[t], step.out_slots[t], step.table[3])
    return Closing(sources, torch.arange(span, device=device) // m, window[t] * m,
                   torch.where(listed, ids, 0),
                   torch.where(pos >= step.p1 - length, step.rows * length + pos % length, sink))
