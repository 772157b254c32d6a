"""The pieces the skinny-matmul kernels (`kernels.gemm.skinny`) share: what a program sets up
and loads before its loop (its channels and slice of K, its first weight tile into L2, its
channels' scales and biases), an activation row as the loop reads it, the row-sum kernel's
in-thread partial sums, and how a program writes its sums (straight, or split-K through the
workspace)."""

import triton
import triton.language as tl

from kernels.norm_rope.activation import silu_mul_f32
from kernels.pdl import pdl_wait, prefetch_rows_l2


@triton.jit
def program_start(w_ptr, scale_ptr, b_ptr, N, K, stride_wn, tiles_per_split,
                  HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr, PDL: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """A program's set-up before its loop: its output channels offs_n `[BN]` (column block
    pid_n, grid axis 0) and their mask, its slice t_lo .. t_hi of K's BLOCK_K tiles (axis 1),
    its weight rows `[BN, 1]`, and its channels' (scale, bias); then (PDL) it waits for the
    kernel before, its first weight tile asked into L2 meanwhile."""
    pid_n = tl.program_id(0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    mask_n = offs_n < N
    t_lo = tl.program_id(1) * tiles_per_split  # this slice's BLOCK_K tiles of K
    t_hi = tl.minimum(t_lo + tiles_per_split, tl.cdiv(K, BLOCK_K))
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn  # [BN, 1]
    first_tile_to_l2(w_ptr, offs_n, N, K, stride_wn, t_lo, PDL, BLOCK_K)
    scale, bias = channel_terms(scale_ptr, b_ptr, offs_n, mask_n, HAS_SCALE, HAS_BIAS)
    pdl_wait(PDL)  # x, the workspace and y belong to the kernels around this one
    return pid_n, offs_n, mask_n, t_lo, t_hi, w_rows, scale, bias


@triton.jit
def x_row(row_ptr, offs_k, mask_k, K, GATED: tl.constexpr):
    """Columns `offs_k` of one activation row, float32 `[BK]`: the row of x itself, or (GATED)
    silu(gate) * up of a `[gate | up]` row of 2K, rounded to x's dtype as the standalone
    activation kernel (`kernels.norm_rope.activation`) rounds its output."""
    if GATED:
        gate = tl.load(row_ptr + offs_k, mask=mask_k, other=0.0).to(tl.float32)  # [BK]
        up = tl.load(row_ptr + K + offs_k, mask=mask_k, other=0.0).to(tl.float32)  # [BK]
        return silu_mul_f32(gate, up).to(row_ptr.dtype.element_ty).to(tl.float32)
    return tl.load(row_ptr + offs_k, mask=mask_k, other=0.0).to(tl.float32)


@triton.jit
def first_tile_to_l2(w_ptr, offs_n, N, K, stride_wn, t_lo, PDL: tl.constexpr,
                     BLOCK_K: tl.constexpr):
    """With PDL, this program's first weight tile (`[BLOCK_N, BLOCK_K]`) is requested into L2
    while the previous kernel is still finishing (more than one tile measured slower on the
    H200: the requests crowd out the loop's own)."""
    if PDL:
        rows = tl.minimum(offs_n, N - 1).to(tl.int64) * stride_wn  # [BN], in bounds
        prefetch_rows_l2(w_ptr, rows, t_lo * BLOCK_K, K, BLOCK_K)


@triton.jit
def fma_fold(acc, w, x, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, VEC: tl.constexpr):
    """acc `[BN, BK / VEC]` plus the products w `[BN, BK]` * x `[BK]`, VEC neighbours along
    K (one thread's) into each partial sum: a chain of VEC FMAs, split in halves by parity."""
    if VEC == 1:
        acc += w * x[None, :]
    else:
        w_even, w_odd = tl.split(tl.reshape(w, [BLOCK_N, BLOCK_K // 2, 2]))  # [BN, BK/2] each
        x_even, x_odd = tl.split(tl.reshape(x, [BLOCK_K // 2, 2]))  # [BK/2] each
        acc = fma_fold(acc, w_even, x_even, BLOCK_N, BLOCK_K // 2, VEC // 2)
        acc = fma_fold(acc, w_odd, x_odd, BLOCK_N, BLOCK_K // 2, VEC // 2)
    return acc


@triton.jit
def channel_terms(scale_ptr, b_ptr, offs_n, mask_n, HAS_SCALE: tl.constexpr,
                  HAS_BIAS: tl.constexpr):
    """(scale, bias) [BN] float32 of the program's output channels (0 where absent), loaded
    first: they are weights, so under PDL they load before the wait, off the critical path of
    the epilogue."""
    scale = tl.zeros_like(offs_n).to(tl.float32)
    bias = tl.zeros_like(offs_n).to(tl.float32)
    if HAS_SCALE:
        scale = tl.load(scale_ptr + offs_n, mask=mask_n, other=0.0)
    if HAS_BIAS:
        bias = tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    return scale, bias


@triton.jit
def skinny_finish(acc, pid_n, offs_n, offs_m, mask_n, mask_m, N, ws_ptr, lock_ptr,
                  scale, bias, y_ptr, SPLIT_K, HAS_SCALE: tl.constexpr,
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
            _skinny_epilogue(acc, y_tile, mask, scale, bias, y_ptr, HAS_SCALE, HAS_BIAS)
    else:
        _skinny_epilogue(acc, y_tile, mask, scale, bias, y_ptr, HAS_SCALE, HAS_BIAS)


@triton.jit
def _skinny_epilogue(acc, y_tile, mask, scale, bias, y_ptr, HAS_SCALE: tl.constexpr,
                     HAS_BIAS: tl.constexpr):
    if HAS_SCALE:
        acc *= scale[:, None]
    if HAS_BIAS:
        acc += bias[:, None]
    tl.store(y_ptr + y_tile, acc.to(y_ptr.dtype.element_ty), mask=mask)
