"""Tensor-parallel layers whose output needs the group: row-parallel linear and
vocab-parallel embedding. Column-parallel layers are plain `nn.Linear`s holding fewer rows.

Both keep `nn.Linear`'s / `nn.Embedding`'s parameter names, so checkpoints map onto them
unchanged; with a group of one they compute exactly what the plain modules compute.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from runtime.worker.tp import TPGroup


class RowParallelLinear(nn.Module):
    """y = x W^T + b where x [T, in] is split by columns over the ranks: each rank holds
    W [out, in / tp] and multiplies its slice of x; the partial sums are all-reduced, then
    the (whole, replicated) bias is added once."""

    def __init__(self, in_local: int, out_features: int, bias: bool, tp: TPGroup) -> None:
        super().__init__()
        self.tp = tp
        self.weight = nn.Parameter(torch.empty(out_features, in_local))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.linear(x, self.weight, self.bias)  # [T, out]
        y = self.tp.all_reduce(F.linear(x, self.weight))  # [T, out], summed over ranks
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """Embedding table split by vocabulary rows: rank r holds ids [r * V/tp, (r+1) * V/tp).
    Each rank looks up the ids it holds (zeros for the others) and the group sums."""

    def __init__(self, vocab_size: int, hidden_size: int, tp: TPGroup) -> None:
        super().__init__()
        self.tp = tp
        rows = tp.shard(vocab_size, "the vocabulary")
        self.start = tp.rank * rows
        self.weight = nn.Parameter(torch.empty(rows, hidden_size))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(ids, self.weight)  # [T, hidden]
        local = ids - self.start  # [T]
        held = (local >= 0) & (local < self.weight.shape[0])  # [T]
        out = F.embedding(local.clamp(0, self.weight.shape[0] - 1), self.weight)  # [T, hidden]
        return self.tp.all_reduce(out * held[:, None].to(out.dtype))
