"""fp8 and fp4 checkpoint weights bound for 16-bit parameters, dequantized at load: the
parameters the model keeps in 16 bits although the checkpoint quantized them (DeepSeek's
routed experts, which the fused MoE kernel reads in 16 bits, and kv_b_proj, which MLA splits
into its absorbed per-head matrices).

Packed fp4 (DeepSeek-V4's routed experts): int8 `[out, in / 2]`, each byte two e2m1 values
(the low nibble first: column 2j, then 2j + 1), and one scale per `FP4_GROUP` columns of a
row, `[out, in / FP4_GROUP]` (e8m0 powers of two in the releases)."""

from __future__ import annotations

import torch

from kernels.gemm.block_fp8 import dequantize_blocks
from runtime.worker.quant.block_fp8_linear import cdiv

FP4_PACKED = torch.int8  # the storage dtype of packed fp4 pairs
FP4_GROUP = 32  # columns of a row sharing one fp4 scale
# e2m1 codes 0..15: sign bit 3, two exponent bits, one mantissa bit
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
               -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


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


def dequantize_fp4(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Packed fp4 `packed` `[out, in / 2]` (int8) and its scales `[out, in / FP4_GROUP]` ->
    float32 `[out, in]`. Raises ValueError for a scale of another shape."""
    out, half = packed.shape
    want = (out, cdiv(2 * half, FP4_GROUP))
    if tuple(scale.shape) != want:
        raise ValueError(f"scale shape {tuple(scale.shape)}, expected {want} for packed fp4 "
                         f"{tuple(packed.shape)} ({FP4_GROUP} columns a scale)")
    codes = packed.view(torch.uint8).long()  # [out, in / 2]
    table = torch.tensor(E2M1_VALUES, device=packed.device)
    values = torch.stack([table[codes & 15], table[codes >> 4]], dim=-1).view(out, 2 * half)
    groups = scale.float().repeat_interleave(FP4_GROUP, dim=1)[:, : 2 * half]  # [out, in]
    return values * groups
