"""fp8 checkpoint weights bound for 16-bit parameters, dequantized at load: the parameters the
model keeps in 16 bits although an fp8 checkpoint quantized them (DeepSeek's routed experts,
which the fused MoE kernel reads in 16 bits, and kv_b_proj, which MLA splits into its
absorbed per-head matrices)."""

from __future__ import annotations

import torch

from kernels.gemm.block_fp8 import dequantize_blocks
from runtime.worker.quant.block_fp8_linear import cdiv


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None
                   ) -> torch.Tensor:
    """A checkpoint's fp8 weight `q` `[out, in]` and its scale -> float32 `[out, in]`: one scale
    per `block` (`[ceil(out / bn), ceil(in / bk)]`), else one for the tensor or one per output
    row (`[out]` or `[out, 1]`). Raises ValueError for a scale of another shape."""
    out, cols = q.shape
    if block is not None:
        want = (cdiv(out, block[0]), cdiv(cols, block[1]))
        if tuple(scale.shape) != want:
            raise ValueError(f"scale shape {tuple(scale.shape)}, expected {want} for a "
                             f"{tuple(q.shape)} weight in {list(block)} blocks")
        return dequantize_blocks(q, scale, block)
    s = scale.float().reshape(-1)  # [1] or [out]
    if s.numel() not in (1, out):
        raise ValueError(f"scale shape {tuple(scale.shape)} is neither one value nor one per "
                         f"row of a {tuple(q.shape)} weight")
    return q.float() * (s if s.numel() == 1 else s[:, None])
