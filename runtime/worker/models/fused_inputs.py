"""A projection together with the elementwise op that makes its input, as one skinny-matmul
launch where the decode batch and weight shape run on that kernel (`kernels.skinny_gemm`),
and as the two ops otherwise (the CPU, larger batches, tensor parallelism, a config that
splits K under the norm).

`norm_linear` is a decoder layer's residual add + RMSNorm before its first projection (QKV,
gate/up); `silu_linear` is SiLU-and-mul before the down projection. At decode batch 1 each
saves a launch of a ~2 us kernel per use, 96 a step on a 32-layer model.
"""

from __future__ import annotations

import torch
from torch import nn

from kernels.skinny_gemm import fuses_norm, skinny_gemm_norm, skinny_gemm_silu
from runtime.worker.ops import TorchOps, TritonOps

Ops = TorchOps | TritonOps


def norm_linear(linear: nn.Module, h: torch.Tensor, residual: torch.Tensor | None,
                norm: nn.Module, ops: Ops) -> tuple[torch.Tensor, torch.Tensor]:
    """(linear(rmsnorm(h + residual)), h + residual) for h `[T, hidden]`; without a residual
    (the first layer) the norm is of h itself and h is the residual stream."""
    operands = linear.skinny_operands(h) if residual is not None else None
    weight = operands[0] if operands is not None else None
    if weight is not None and fuses_norm(weight.dtype == torch.float8_e4m3fn, h.shape[0],
                                         *weight.shape):
        return skinny_gemm_norm(h.contiguous(), residual, norm.weight, norm.eps, *operands)
    if residual is None:
        return linear(ops.rmsnorm(h, norm.weight, norm.eps)), h
    x, residual = ops.add_rmsnorm(h, residual, norm.weight, norm.eps)
    return linear(x), residual


def silu_linear(linear: nn.Module, gate_up: torch.Tensor, ops: Ops) -> torch.Tensor:
    """linear(silu(gate) * up) for gate_up `[T, 2 * inter]` (gate first)."""
    operands = linear.skinny_operands(gate_up[:, : gate_up.shape[1] // 2])
    if operands is not None:
        return skinny_gemm_silu(gate_up.contiguous(), *operands)
    return linear(ops.silu_mul(gate_up))
