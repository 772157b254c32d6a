"""Skinny matmul y = x W^T (+ b) for a few rows of x: the decode-time linear layers at small batch.

At batch 1 a linear layer reads its whole weight to produce a handful of outputs, so it is
memory bound, like decode attention. Each program streams BLOCK_N whole rows of W (contiguous
memory, read once) against all M rows of x and reduces over K in float32 registers; there is
no split-K and so no second reduction pass, which is where cuBLAS's small-M kernels lose time.
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

MAX_ROWS = 4  # x rows one launch handles; larger batches are better served by tensor-core GEMMs


@dataclass(frozen=True)
class GemvConfig:
    """Launch knobs (bench/kernels.py --only gemv --sweep searches them)."""

    block_n: int = 8
    block_k: int = 512
    num_warps: int = 4


DEFAULT_CONFIG = GemvConfig()


@triton.jit
def _gemv_kernel(
    x_ptr,  # [M, K]
    w_ptr,  # [N, K], stride_wn between rows, unit stride along K
    b_ptr,  # [N] when HAS_BIAS
    y_ptr,  # [M, N] contiguous
    N,
    K,
    stride_xm,
    stride_wn,
    M: tl.constexpr,
    BLOCK_M: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    offs_m = tl.arange(0, BLOCK_M)  # [BM]
    mask_n = offs_n < N
    mask_m = offs_m < M
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)  # [BK]
        mask_k = offs_k < K
        w = tl.load(w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :],
                    mask=mask_n[:, None] & mask_k[None, :], other=0.0)  # [BN, BK]
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
                    mask=mask_m[:, None] & mask_k[None, :], other=0.0)  # [BM, BK]
        prod = w.to(tl.float32)[None, :, :] * x.to(tl.float32)[:, None, :]  # [BM, BN, BK]
        acc += tl.sum(prod, axis=2)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    y = y_ptr + offs_m[:, None] * N + offs_n[None, :]
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
         config: GemvConfig | None = None) -> torch.Tensor:
    """x `[M, K]` (M <= MAX_ROWS, unit stride along K) times weight `[N, K]` (unit stride
    along K) transposed, plus bias `[N]`: y `[M, N]` in x's dtype, accumulated in float32."""
    assert x.dim() == 2 and weight.dim() == 2, "x must be [M, K] and weight [N, K]"
    M, K = x.shape
    N = weight.shape[0]
    assert weight.shape[1] == K, f"x has K={K}, weight {tuple(weight.shape)}"
    assert 1 <= M <= MAX_ROWS, f"gemv handles 1..{MAX_ROWS} rows, got {M}"
    assert x.stride(1) == 1 and weight.stride(1) == 1, "x and weight need unit stride along K"
    assert x.dtype == weight.dtype, f"x {x.dtype} vs weight {weight.dtype}"
    if bias is not None:
        assert bias.shape == (N,) and bias.is_contiguous(), f"bias must be a contiguous [{N}]"
    cfg = config or DEFAULT_CONFIG
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    _gemv_kernel[(triton.cdiv(N, cfg.block_n),)](
        x, weight, bias if bias is not None else y, y, N, K, x.stride(0), weight.stride(0),
        M=M, BLOCK_M=triton.next_power_of_2(M), HAS_BIAS=bias is not None,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, num_warps=cfg.num_warps,
    )  # fmt: skip
    return y


def gemv_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None):
    """Torch reference of `gemv`: the product in float32, rounded to x's dtype."""
    y = x.float() @ weight.float().T  # [M, N]
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)
