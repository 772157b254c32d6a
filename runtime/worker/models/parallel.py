"""Tensor-parallel layers whose output needs the group: row-parallel linear and
vocab-parallel embedding. Column-parallel layers are `nn.Linear`s (`DenseLinear`) holding
fewer rows.

Both keep `nn.Linear`'s / `nn.Embedding`'s parameter names, so checkpoints map onto them
unchanged; with a group of one they compute exactly what the plain modules compute.
`column_linear` and `row_linear` pick the storage of a projection by the model's
`QuantScheme`: 16-bit, fp8 with per-channel scales (`Fp8Linear`: `--quantization fp8`, or a
checkpoint's per-channel / per-tensor fp8) or fp8 with block scales (`BlockFp8Linear`), the
modules a checkpoint keeps in 16 bits staying so.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from runtime.worker.models.dense_linear import DenseLinear, dense_linear
from runtime.worker.ops import GateAct
from runtime.worker.quant.block_fp8_linear import BlockFp8Linear
from runtime.worker.quant.fp8_linear import Fp8Linear
from runtime.worker.quant.scheme import QuantScheme
from runtime.worker.tp import TPGroup


def column_linear(in_features: int, out_local: int, bias: bool,
                  quantization: QuantScheme | str, modules: Sequence[str] = ()) -> nn.Module:
    """A column-parallel projection (this rank's `out_local` output rows), or any projection
    whose output needs no group (a replicated one, or a row shard whose partial sums the
    caller reduces), stored as `quantization` says for checkpoint `modules` (the names of
    the parts it fuses)."""
    scheme = QuantScheme.of(quantization)
    kind = scheme.quantized(modules)
    if kind == "fp8_block":
        return BlockFp8Linear(in_features, out_local, bias, scheme.block)
    if kind == "fp8":
        return Fp8Linear(in_features, out_local, bias)
    return DenseLinear(in_features, out_local, bias=bias)


def row_linear(in_local: int, out_features: int, bias: bool, tp: TPGroup,
               quantization: QuantScheme | str, modules: Sequence[str] = ()) -> nn.Module:
    """A row-parallel projection (this rank's `in_local` input columns), stored as
    `quantization` says for checkpoint `modules`."""
    scheme = QuantScheme.of(quantization)
    kind = scheme.quantized(modules)
    if kind == "fp8_block":
        return BlockFp8RowParallelLinear(in_local, out_features, bias, tp, scheme.block)
    if kind == "fp8":
        return Fp8RowParallelLinear(in_local, out_features, bias, tp)
    return RowParallelLinear(in_local, out_features, bias, tp)


class RowParallel:
    """y = x W^T + b where x [T, in] is split by columns over the ranks: each rank holds
    W [out, in / tp] and takes the `product` of its slice of x; the partial sums are
    all-reduced, then the (whole, replicated) bias is added once. A mixin over a layer with
    `tp`, `bias` and `product(x, bias, gate_act)`."""

    def forward(self, x: torch.Tensor, gate_act: GateAct | None = None) -> torch.Tensor:
        """x `[T, in / tp]` (`[T, 2 * in / tp]` with `gate_act`, the MLP's activation)."""
        if self.tp.size == 1:
            return self.product(x, self.bias, gate_act)  # [T, out]
        y = self.tp.all_reduce(self.product(x, None, gate_act))  # [T, out], summed over ranks
        return y if self.bias is None else y + self.bias


class RowParallelLinear(RowParallel, nn.Module):
    """A row-parallel projection with a 16-bit weight (`dense_linear`)."""

    def __init__(self, in_local: int, out_features: int, bias: bool, tp: TPGroup) -> None:
        super().__init__()
        self.tp = tp
        self.weight = nn.Parameter(torch.empty(out_features, in_local))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def product(self, x: torch.Tensor, bias: torch.Tensor | None,
                gate_act: GateAct | None) -> torch.Tensor:
        return dense_linear(x, self.weight, bias, gate_act)  # [T, out]


class Fp8RowParallelLinear(RowParallel, Fp8Linear):
    """`RowParallelLinear` with an fp8 weight: each rank's `[out, in / tp]` shard has its own
    per-output-channel scales, taken over the columns it holds (a checkpoint's scales apply
    to every column: each rank holds them all)."""

    def __init__(self, in_local: int, out_features: int, bias: bool, tp: TPGroup) -> None:
        super().__init__(in_local, out_features, bias)
        self.tp = tp


class BlockFp8RowParallelLinear(RowParallel, BlockFp8Linear):
    """`RowParallelLinear` with a block-scaled fp8 weight: each rank holds the scale columns
    of its input columns (whole blocks)."""

    def __init__(self, in_local: int, out_features: int, bias: bool, tp: TPGroup,
                 block: tuple[int, int]) -> None:
        super().__init__(in_local, out_features, bias, block)
        self.tp = tp


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
