"""DeepSeek-V4's partial blocks, out of the pool: the compressor inputs (projected kv and
gate logits) a request's next entries still need, in a ring per request row.

A compressor of rate m closing window w reads the inputs of the window's tokens, and a CSA
one (`overlap`) also those of window w - 1. So once a request's kept tokens end at
position q, it needs the inputs of its tokens from `(q // m - overlap) * m` on: at most
m - 1 tokens (HCA), or 2m - 1 (CSA). `InputRing` keeps them per row of the worker's request
table, position p at `p % length`, in the model's dtype, as the pool rows kept them before.
Nothing of it is shared between requests, cached, written back or loaded.

Each step writes the inputs of its sequences' last `length` positions (`ring_length`: the
2m, or m, the next entry may read, plus the most drafts of a verify step), so the ring is
indexed by position alone: a verify step's rejected drafts, computed again by the next step
from where its kept tokens end, overwrite their own cells, and, being at most `drafts`
positions past that end, never the cells of the kept positions the next entries read.
Nothing is rolled back, and nothing of a step depends on how many drafts it keeps.

So a request's partial block is rebuilt from its own tokens: a prefix hit of P tokens
lands where the pool's rows hold everything the next tokens read but the overlap inputs
of the last CSA window before P. `prefix_rule` gives the scheduler the alignment of hits
(P a multiple of every rate: no window is open at P) and the tokens it computes again
before P (the largest CSA rate: the overlap window's inputs). Those `replay` tokens
recompute their inputs only; their rows and the entries they close are the prefix's own,
in the pool (`RowStarts`).
"""

from __future__ import annotations

import math

import torch

from runtime.worker.models.deepseek_v4_arch import CSA, DeepseekV4Arch


def prefix_rule(arch: DeepseekV4Arch) -> tuple[int, int]:
    """(align, replay): prefix hits are rounded down to a multiple of `align` (every
    compression rate), then the last `replay` tokens of the hit (the largest CSA rate, 0
    without CSA layers) are computed again."""
    rates = [arch.rate(i) for i in range(arch.num_layers)]  # 0: sliding window only
    csa = [r for r, kind in zip(rates, arch.layer_types) if kind == CSA]
    return math.lcm(1, *(r for r in rates if r)), max(csa, default=0)


def ring_length(rate: int, overlap: bool, drafts: int = 0) -> int:
    """Positions a compressor's ring keeps: what the next entry may read (m - 1 open
    tokens, plus in CSA the m of the overlap window), rounded up to whole windows, and the
    `drafts` positions a verify step may compute past its kept ones."""
    return (2 * rate if overlap else rate) + drafts


def ring_values(arch: DeepseekV4Arch) -> int:
    """Values one request row's rings hold, all layers: each compressor's kv and gate
    logits (CSA: two series of `head_dim`, and the indexer's two of `index_head_dim`; HCA:
    one of `head_dim`) over its ring's positions."""
    total = 0
    for i, kind in enumerate(arch.layer_types):
        rate = arch.rate(i)
        if rate == 0:
            continue
        if kind == CSA:
            total += ring_length(rate, True) * 2 * (2 * arch.head_dim + 2 * arch.index_head_dim)
        else:
            total += ring_length(rate, False) * 2 * arch.head_dim
    return total


def first_window(start: torch.Tensor, rate: int, overlap: bool) -> torch.Tensor:
    """The first window whose inputs all lie at or after position `start` (per element)."""
    return torch.where(start == 0, 0, -(-start // rate) + int(overlap))


class InputRing:
    """One compressor's inputs of each row's last `length` positions: kv and gate logits
    `[rows + 1, length, width]`, position p of row r in cell `r * length + p % length` of
    the flat view (`cells`); the last row is a sink that writes of nothing go to (the
    pool's slot 0 likewise), so that a step writes its tokens' inputs in one scatter."""

    def __init__(self, rows: int, length: int, width: int, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        self.length, self.sink = length, rows * length
        self.kv = torch.zeros(rows + 1, length, width, dtype=dtype, device=device)
        self.gate = torch.zeros(rows + 1, length, width, dtype=dtype, device=device)

    @property
    def nbytes(self) -> int:
        return self.kv.nbytes + self.gate.nbytes

    def cells(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The flat views kv, gate `[(rows + 1) * length, width]`."""
        width = self.kv.shape[-1]
        return self.kv.view(-1, width), self.gate.view(-1, width)


class RowStarts:
    """Per request row, the first position whose inputs its request computed itself (-1:
    the row was bound to a new request and has computed nothing yet), on the device. Its
    first step sets it: 0, or after a prefix hit the start of the replayed tokens, whose
    rows and entries are the prefix's (`replay` tokens, written nowhere). Row `rows` is a
    sink, as the rings' last row: the padding rows of a decode graph name it."""

    def __init__(self, rows: int, replay: int, device: torch.device | str) -> None:
        self.starts = torch.full((rows + 1,), -1, dtype=torch.int64, device=device)
        self.replay = replay

    def bind(self, rows: list[int]) -> None:
        """Rows `rows` now serve new requests: their partial blocks are gone."""
        self.starts[torch.tensor(rows, dtype=torch.int64, device=self.starts.device)] = -1

    def begin(self, rows: torch.Tensor, p0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """For a step of the sequences on `rows` `[B]` (distinct) from positions `p0` `[B]`:
        (each one's request's first computed position, the end of the positions the pool
        already holds for it) `[B]` int64 each."""
        kept = self.starts[rows]  # [B]
        start = torch.where(kept < 0, p0.long(), kept)
        self.starts[rows] = start
        return start, torch.where(start > 0, start + self.replay, 0)
