"""The 16-bit linear layers' product: cuBLAS, or the skinny-matmul kernel where the GPU sweep
measured it faster for a decode batch of that many rows and that weight shape.

The choice is `kernels.skinny_gemm_configs.use_kernel`, a lookup in the sweep's table file
(without one every product is cuBLAS's). A down projection given the MLP's gated activation
takes it inside the kernel's loads for a single token (`fuses_gate`),
whatever the table says: the activation's launch costs more than the kernel's distance from
cuBLAS there.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.gemm.skinny import MAX_ROWS, skinny_gemm
from kernels.gemm.skinny_configs import use_kernel
from runtime.worker.ops import GateAct


def _kernel_takes(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the skinny kernel can take x: on CUDA, `[T, in]` of 1..MAX_ROWS rows, in the
    weight's dtype."""
    return x.is_cuda and x.dim() == 2 and 0 < x.shape[0] <= MAX_ROWS and x.dtype == weight.dtype


def fuses_gate(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a down projection of this `[gate | up]` x takes the activation in its loads
    (`skinny_gemm(x, weight, gated=True)`) rather than after an activation launch: one row,
    16-bit. Measured on the H200 (dummy:llama3-8b, batch-1 step): 45-54 us faster in bf16;
    40-41 us slower with fp8 weights, and at four rows 0.7-1.6 ms (bf16) and 1.8-2.1 ms (fp8)
    slower: every program re-reads the `[gate | up]` rows, which costs more than the launch."""
    return (_kernel_takes(x, weight) and x.shape[0] == 1
            and x.dtype in (torch.float16, torch.bfloat16))


def dense_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 gate_act: GateAct | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for x `[T, in]` and a 16-bit weight `[out, in]` -> `[T, out]`.
    With `gate_act` (the MLP's silu-and-mul), x is `[T, 2 * in]`, gate then up, and the product
    is taken of gate_act(x): inside the kernel's loads where `fuses_gate`, else after it."""
    if gate_act is not None:
        if fuses_gate(x, weight):
            return skinny_gemm(x.contiguous(), weight, None, bias, gated=True)  # [T, out]
        x = gate_act(x)  # [T, in]
    if _kernel_takes(x, weight) and use_kernel(False, x.shape[0], *weight.shape):
        return skinny_gemm(x.contiguous(), weight, None, bias)  # [T, out]
    return F.linear(x, weight, bias)  # [T, out]


class DenseLinear(nn.Linear):
    """`nn.Linear` (same parameters and names) whose product is `dense_linear`."""

    def forward(self, x: torch.Tensor, gate_act: GateAct | None = None) -> torch.Tensor:
        return dense_linear(x, self.weight, self.bias, gate_act)  # [T, out]
