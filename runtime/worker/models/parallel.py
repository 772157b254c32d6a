"""Tensor-parallel layers whose output needs the group: row-parallel linear and
vocab-parallel embedding. Column-parallel layers are `nn.Linear`s (`DenseLinear`) holding
fewer rows.

Both keep `nn.Linear`'s / `nn.Embedding`'s parameter names, so checkpoints map onto them
unchanged; with a group of one they compute exactly what the plain modules compute.
`column_linear` and `row_linear` pick the 16-bit or the fp8 (`Fp8Linear`) variant of the
projections by `--quantization`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from runtime.worker.models.dense_linear import DenseLinear, dense_linear
from runtime.worker.ops import GateAct
from runtime.worker.quant.fp8_linear import Fp8Linear, fp8_linear
from runtime.worker.tp import TPGroup

QUANTIZATIONS = ("none", "fp8")


def column_linear(in_features: int, out_local: int, bias: bool, quantization: str) -> nn.Module:
    """A column-parallel projection (this rank's `out_local` output rows), 16-bit or fp8."""
    if quantization == "fp8":
        return Fp8Linear(in_features, out_local, bias)
    return DenseLinear(in_features, out_local, bias=bias)


def row_linear(in_local: int, out_features: int, bias: bool, tp: TPGroup,
               quantization: str) -> nn.Module:
    """A row-parallel projection (this rank's `in_local` input columns), 16-bit or fp8."""
    if quantization == "fp8":
        return Fp8RowParallelLinear(in_local, out_features, bias, tp)
    return RowParallelLinear(in_local, out_features, bias, tp)


class RowParallelLinear(nn.Module):
    """y = x W^T + b where x [T, in] is split by columns over the ranks: each rank holds
    W [out, in / tp] and multiplies its slice of x; the partial sums are all-reduced, then
    the (whole, replicated) bias is added once."""

    def __init__(self, in_local: int, out_features: int, bias: bool, tp: TPGroup) -> None:
        super().__init__()
        self.tp = tp
        self.weight = nn.Parameter(torch.empty(out_features, in_local))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor, gate_act: GateAct | None = None) -> torch.Tensor:
        """x `[T, in / tp]` (`[T, 2 * in / tp]` with `gate_act`: see `dense_linear`)."""
        if self.tp.size == 1:
            return dense_linear(x, self.weight, self.bias, gate_act)  # [T, out]
        y = self.tp.all_reduce(dense_linear(x, self.weight, None, gate_act))  # [T, out]
        return y if self.bias is None else y + self.bias


class Fp8RowParallelLinear(Fp8Linear):
    """`RowParallelLinear` with an fp8 weight: each rank's `[out, in / tp]` shard has its own
    per-output-channel scales, taken over the columns it holds."""

    def __init__(self, in_local: int, out_features: int, bias: bool, tp: TPGroup) -> None:
        super().__init__(in_local, out_features, bias)
        self.tp = tp

    def forward(self, x: torch.Tensor, gate_act: GateAct | None = None) -> torch.Tensor:
        if self.tp.size == 1:
            return super().forward(x, gate_act)  # [T, out]
        y = fp8_linear(x, self.weight, self.weight_scale, None, gate_act)  # [T, out]
        y = self.tp.all_reduce(y)  # summed over ranks
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
