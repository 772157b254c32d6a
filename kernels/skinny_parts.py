"""What the two skinny-matmul kernels (`skinny_gemm`'s tensor-core one and `skinny_rowsum`)
share: how a tile of x is formed (the prologue), the early L2 request of weights under PDL,
and the split-K finish.

Prologues, fused into the product so that a decode step launches one kernel fewer per use:
- PRO_PLAIN: x as given.
- PRO_NORM: a decoder layer's residual add and RMSNorm. h = x + residual (rounded to x's
  dtype, as the residual stream is kept; the programs of the first column block write it
  out), the product is taken over h * gamma, and each output row is scaled by its
  rstd = 1 / sqrt(mean(h^2) + eps) after the loop, since rstd is one number per row. The
  row's sum of squares is accumulated in the same loop, so a program must see all of K
  (one split).
- PRO_SILU: x `[M, 2K]` holds gate then up, and the product is over silu(gate) * up.
"""

import triton
import triton.language as tl

from kernels.pdl import pdl_prefetch_l2

PRO_PLAIN = tl.constexpr(0)
PRO_NORM = tl.constexpr(1)
PRO_SILU = tl.constexpr(2)


@triton.jit
def load_x(x_ptrs, r_ptrs, h_ptrs, g_ptrs, mask, ss, write_h, K, PRO: tl.constexpr):
    """A tile of x through the prologue (same shape as the pointer tiles) and the running sum
    of squares `ss` (float32, that shape; PRO_NORM adds h^2 to it). PRO_PLAIN gives x in its
    own dtype, the others float32. `write_h` (a mask that broadcasts to `mask`'s shape) says
    where this program stores h."""
    x = tl.load(x_ptrs, mask=mask, other=0.0)
    if PRO == PRO_NORM:
        r = tl.load(r_ptrs, mask=mask, other=0.0)
        h = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(h_ptrs, h, mask=mask & write_h)
        hf = h.to(tl.float32)
        ss += hf * hf
        x = hf * tl.load(g_ptrs, mask=mask, other=0.0).to(tl.float32)
    elif PRO == PRO_SILU:
        gate = x.to(tl.float32)
        up = tl.load(x_ptrs + K, mask=mask, other=0.0).to(tl.float32)
        x = gate / (1.0 + tl.exp(-gate)) * up
    return x, ss


@triton.jit
def rstd_of(ss, K, eps, AXIS: tl.constexpr):
    """1 / sqrt(mean(h^2) + eps) of the rows whose squares `ss` holds along AXIS."""
    return 1.0 / tl.sqrt(tl.sum(ss, axis=AXIS) / K + eps)


@triton.jit
def weights_to_l2(w_ptr, offs_n, N, K, stride_wn, t_lo, t_hi, prefetch_tiles,
                  LINE: tl.constexpr, LINES: tl.constexpr, PDL: tl.constexpr,
                  BLOCK_K: tl.constexpr):
    """With PDL, this program's first `prefetch_tiles` weight tiles (`[BLOCK_N, BLOCK_K]`
    each, LINES lines of LINE elements a row) are requested into L2 while the previous kernel
    is still running."""
    if PDL:
        rows = tl.minimum(offs_n, N - 1).to(tl.int64) * stride_wn  # [BN], in bounds
        for t in range(t_lo, tl.minimum(t_lo + prefetch_tiles, t_hi)):
            cols = tl.minimum(t * BLOCK_K + tl.arange(0, LINES) * LINE, K - 1)  # [LINES]
            pdl_prefetch_l2(w_ptr + rows[:, None] + cols[None, :], PDL)


@triton.jit
def skinny_finish(acc, pid_n, offs_n, offs_m, mask_n, mask_m, N, ws_ptr, lock_ptr,
                  scale_ptr, b_ptr, y_ptr, SPLIT_K, HAS_SCALE: tl.constexpr,
                  HAS_BIAS: tl.constexpr):
    """Write a program's `[BN, BM]` sums: straight to y, or with split-K through the
    workspace, the last slice to arrive writing y."""
    y_tile = offs_m[None, :] * N + offs_n[:, None]  # [BN, BM] offsets into y (and ws)
    mask = mask_n[:, None] & mask_m[None, :]  # [BN, BM]
    if SPLIT_K > 1:
        tl.atomic_add(ws_ptr + y_tile, acc, mask=mask, sem="relaxed")
        tl.debug_barrier()
        arrived = tl.atomic_add(lock_ptr + pid_n, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:
            zero = tl.zeros_like(acc)
            acc = tl.atomic_add(ws_ptr + y_tile, zero, mask=mask, sem="acquire")  # read at L2
            tl.store(ws_ptr + y_tile, zero, mask=mask)
            tl.atomic_xchg(lock_ptr + pid_n, 0)
            _epilogue(acc, offs_n, mask_n, y_tile, mask, scale_ptr, b_ptr, y_ptr,
                      HAS_SCALE, HAS_BIAS)
    else:
        _epilogue(acc, offs_n, mask_n, y_tile, mask, scale_ptr, b_ptr, y_ptr,
                  HAS_SCALE, HAS_BIAS)


@triton.jit
def _epilogue(acc, offs_n, mask_n, y_tile, mask, scale_ptr, b_ptr, y_ptr,
              HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr):
    if HAS_SCALE:
        acc *= tl.load(scale_ptr + offs_n, mask=mask_n, other=0.0)[:, None]
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[:, None]
    tl.store(y_ptr + y_tile, acc.to(y_ptr.dtype.element_ty), mask=mask)
