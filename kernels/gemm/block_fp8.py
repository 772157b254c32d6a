"""Block-scaled fp8 matmul y = x W^T (+ b): W `[N, K]` float8_e4m3fn with one float32 scale
per `(GROUP_N, GROUP_K)` block (`w_scale` `[ceil(N / GROUP_N), ceil(K / GROUP_K)]`, the last
blocks partial when N or K is not a multiple), as block-quantized fp8 checkpoints ship it.

Two modes, one kernel:
- w8a8: x is fp8 too, quantized per token and GROUP_K-column group (`x_scale`
  `[M, ceil(K / GROUP_K)]`, `kernels.gemm.fp8_quant.per_token_group_fp8`); tiles multiply on the
  fp8 tensor cores.
- weight-only: x in 16 bits (or float32), each W tile widened to x's dtype in registers.
The K tile is one scale block (BLOCK_K = GROUP_K), so each K step's partial product is
scaled once, by the x row's group scale and the W block's, and accumulated in float32. Each
column of a tile reads the scale of its own block row, so BLOCK_N need not divide GROUP_N.
No host sync and no autotuning: safe inside a CUDA graph capture. The tile sizes are a
rule, not a measured table.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

FP8 = torch.float8_e4m3fn


@triton.jit
def _block_fp8_gemm_kernel(
    x_ptr,  # [M, K], unit stride along K: fp8 (X_FP8) or 16/32-bit
    xs_ptr,  # [M, cdiv(K, BLOCK_K)] float32 when X_FP8
    w_ptr,  # [N, K] fp8, unit stride along K
    ws_ptr,  # [cdiv(N, GROUP_N), cdiv(K, BLOCK_K)] float32, unit stride along K blocks
    b_ptr,  # [N] when HAS_BIAS
    y_ptr,  # [M, N], unit stride along N
    M, N, K, stride_xm, stride_xsm, stride_wn, stride_wsn, stride_ym,
    GROUP_N: tl.constexpr, X_FP8: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    offs_k = tl.arange(0, BLOCK_K)  # [BK]
    mask_m = offs_m < M
    mask_n = offs_n < N
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]  # [BM, BK]
    w_ptrs = w_ptr + offs_n[None, :] * stride_wn + offs_k[:, None]  # [BK, BN]
    ws_ptrs = ws_ptr + (offs_n // GROUP_N) * stride_wsn  # [BN]: each column's block row
    xs_ptrs = xs_ptr + offs_m * stride_xsm  # [BM]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        mask_k = offs_k < K - kb * BLOCK_K
        x = tl.load(x_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        ws = tl.load(ws_ptrs + kb, mask=mask_n, other=0.0)  # [BN]
        if X_FP8:
            xs = tl.load(xs_ptrs + kb, mask=mask_m, other=0.0)  # [BM]
            acc += tl.dot(x, w) * (xs[:, None] * ws[None, :])
        else:
            acc += tl.dot(x, w.to(x.dtype)) * ws[None, :]
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def tiles(m: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) for M rows: the smallest MMA height that holds a decode batch, and
    narrower column tiles for few rows so that a small step still spreads over the SMs."""
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64
    return block_m, 64 if m <= 64 else 128


def block_fp8_gemm(x: torch.Tensor, x_scale: torch.Tensor | None, w: torch.Tensor,
                   w_scale: torch.Tensor, block: tuple[int, int],
                   bias: torch.Tensor | None = None,
                   out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x `[M, K]` (fp8 with `x_scale` `[M, ceil(K / block[1])]`, or 16/32-bit with None) times
    fp8 `w` `[N, K]` with block scales `w_scale` `[ceil(N / block[0]), ceil(K / block[1])]`,
    plus `bias` `[N]` -> `[M, N]` in `out_dtype` (default: x's dtype; required for fp8 x)."""
    assert x.dim() == 2 and x.stride(1) == 1 and w.stride(1) == 1, "unit stride along K"
    assert w.dtype == FP8 and w_scale.dtype == torch.float32 and w_scale.stride(1) == 1
    M, K = x.shape
    N = w.shape[0]
    group_n, group_k = block
    k_blocks = triton.cdiv(K, group_k)
    assert w.shape[1] == K and tuple(w_scale.shape) == (triton.cdiv(N, group_n), k_blocks)
    x_fp8 = x.dtype == FP8
    assert x_fp8 == (x_scale is not None), "an fp8 x comes with its group scales, only it"
    if x_fp8:
        assert out_dtype is not None and tuple(x_scale.shape) == (M, k_blocks)
        assert x_scale.stride(1) == 1
    y = torch.empty(M, N, dtype=out_dtype or x.dtype, device=x.device)
    if M == 0:
        return y
    block_m, block_n = tiles(M)
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
    xs = x_scale if x_fp8 else w_scale  # an unread placeholder without x scales
    _block_fp8_gemm_kernel[grid](
        x, xs, w, w_scale, bias if bias is not None else w_scale, y,
        M, N, K, x.stride(0), xs.stride(0), w.stride(0), w_scale.stride(0), y.stride(0),
        GROUP_N=group_n, X_FP8=x_fp8, HAS_BIAS=bias is not None,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=group_k, num_warps=4, num_stages=3,
    )  # fmt: skip
    return y


def dequantize_blocks(q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]
                      ) -> torch.Tensor:
    """q `[N, K]` (fp8) times its block scales `[ceil(N / bn), ceil(K / bk)]` -> float32
    `[N, K]`: element (n, k) times scale[n // bn, k // bk]."""
    n, k = q.shape
    full = scale.float().repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)
    return q.float() * full[:n, :k]


def block_fp8_gemm_ref(x: torch.Tensor, x_scale: torch.Tensor | None, w: torch.Tensor,
                       w_scale: torch.Tensor, block: tuple[int, int],
                       bias: torch.Tensor | None = None,
                       out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Torch reference of `block_fp8_gemm`: both operands dequantized, multiplied in float32."""
    xf = x.float()
    if x_scale is not None:
        xf = dequantize_blocks(x, x_scale, (1, block[1]))  # [M, K]
    y = xf @ dequantize_blocks(w, w_scale, block).t()  # [M, N] f32
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype or x.dtype)
