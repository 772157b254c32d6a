"""The 16-bit linear layers' product: cuBLAS, or the skinny-matmul kernel where the GPU sweep
measured it faster for a decode batch of that many rows and that weight shape.

The choice is `kernels.skinny_gemm_configs.use_kernel`, a lookup in the sweep's table file
(without one every product is cuBLAS's).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.skinny_gemm import MAX_ROWS, skinny_gemm
from kernels.skinny_gemm_configs import use_kernel


def dense_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
                 ) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for x `[T, in]` and a 16-bit weight `[out, in]` -> `[T, out]`."""
    t = x.shape[0]
    if (x.is_cuda and x.dim() == 2 and 0 < t <= MAX_ROWS and x.dtype == weight.dtype
            and use_kernel(False, t, *weight.shape)):
        return skinny_gemm(x.contiguous(), weight, None, bias)  # [T, out]
    return F.linear(x, weight, bias)  # [T, out]


class DenseLinear(nn.Linear):
    """`nn.Linear` (same parameters and names) whose product is `dense_linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dense_linear(x, self.weight, self.bias)  # [T, out]
