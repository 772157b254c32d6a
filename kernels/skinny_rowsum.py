"""The row-sum skinny matmul (`SkinnyConfig.dot=False`, at most four rows of x): each weight
element is widened once to float32, multiplied by each x row and summed in-thread into float32
partial sums (one per `VEC` elements a thread holds, per row), which are reduced across K
once, after the loop: no shuffles or MMA operand reshuffling in the loop, and the weights are
read once for up to four rows. Launched by `kernels.skinny_gemm`, which documents the
operands; the prologue and the split-K finish are `kernels.skinny_parts`.
"""

import triton
import triton.language as tl

from kernels.pdl import pdl_wait
from kernels.skinny_parts import PRO_NORM, load_x, rstd_of, skinny_finish, weights_to_l2


@triton.jit(do_not_specialize=["M", "tiles_per_split", "SPLIT_K", "prefetch_tiles"])
def _skinny_rowsum_kernel(
    x_ptr, w_ptr, scale_ptr, b_ptr, y_ptr, ws_ptr, lock_ptr,  # as in _skinny_dot_kernel
    r_ptr, g_ptr, h_ptr, eps,  # the PRO_NORM operands, as in _skinny_dot_kernel
    M, N, K, stride_xm, stride_rm, stride_wn, tiles_per_split, SPLIT_K, prefetch_tiles,
    HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr,
    PRO: tl.constexpr, LINE: tl.constexpr, LINES: tl.constexpr, PDL: tl.constexpr,
    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, VEC: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    offs_m = tl.arange(0, ROWS)  # [R]
    mask_n = offs_n < N
    mask_m = offs_m < M
    t_lo = pid_k * tiles_per_split
    t_hi = tl.minimum(t_lo + tiles_per_split, tl.cdiv(K, BLOCK_K))
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn  # [BN, 1]
    # Float32 partial sums, one per row of x and per VEC weight elements a thread holds (at
    # most one 16-byte load): each tile's products are summed in-thread into them, and across
    # K once, after the loop. A larger VEC saves registers: more programs per SM, more loads
    # in flight.
    acc0 = tl.zeros([BLOCK_N, BLOCK_K // VEC], tl.float32)
    acc1 = tl.zeros([BLOCK_N, BLOCK_K // VEC], tl.float32)
    acc2 = tl.zeros([BLOCK_N, BLOCK_K // VEC], tl.float32)
    acc3 = tl.zeros([BLOCK_N, BLOCK_K // VEC], tl.float32)
    ss0 = tl.zeros([BLOCK_K], tl.float32)  # PRO_NORM: each row's sum of squares, per column
    ss1 = tl.zeros([BLOCK_K], tl.float32)
    ss2 = tl.zeros([BLOCK_K], tl.float32)
    ss3 = tl.zeros([BLOCK_K], tl.float32)
    weights_to_l2(w_ptr, offs_n, N, K, stride_wn, t_lo, t_hi, prefetch_tiles, LINE, LINES,
                  PDL, BLOCK_K)  # fmt: skip
    pdl_wait(PDL)  # x, the workspace and y belong to the kernels around this one
    for t in range(t_lo, t_hi):
        offs_k = t * BLOCK_K + tl.arange(0, BLOCK_K)  # [BK]
        mask_k = (offs_k < K) | EVEN_K
        w = tl.load(w_rows + offs_k[None, :], mask=mask_n[:, None] & mask_k[None, :],
                    other=0.0, eviction_policy="evict_first")  # [BN, BK]
        wf = w.to(tl.float32)
        acc0, ss0 = _row(acc0, ss0, wf, 0, x_ptr, r_ptr, h_ptr, g_ptr, offs_k, mask_k, pid_n,
                         M, K, stride_xm, stride_rm, PRO, BLOCK_N, BLOCK_K, VEC)  # fmt: skip
        if ROWS > 1:
            acc1, ss1 = _row(acc1, ss1, wf, 1, x_ptr, r_ptr, h_ptr, g_ptr, offs_k, mask_k,
                             pid_n, M, K, stride_xm, stride_rm, PRO, BLOCK_N, BLOCK_K, VEC)
        if ROWS > 2:
            acc2, ss2 = _row(acc2, ss2, wf, 2, x_ptr, r_ptr, h_ptr, g_ptr, offs_k, mask_k,
                             pid_n, M, K, stride_xm, stride_rm, PRO, BLOCK_N, BLOCK_K, VEC)
            acc3, ss3 = _row(acc3, ss3, wf, 3, x_ptr, r_ptr, h_ptr, g_ptr, offs_k, mask_k,
                             pid_n, M, K, stride_xm, stride_rm, PRO, BLOCK_N, BLOCK_K, VEC)
    row = offs_m[None, :]  # [1, R]
    acc = tl.where(row == 0, _row_sum(acc0, ss0, K, eps, PRO)[:, None], 0.0)  # [BN, R]
    if ROWS > 1:
        acc = tl.where(row == 1, _row_sum(acc1, ss1, K, eps, PRO)[:, None], acc)
    if ROWS > 2:
        acc = tl.where(row == 2, _row_sum(acc2, ss2, K, eps, PRO)[:, None], acc)
        acc = tl.where(row == 3, _row_sum(acc3, ss3, K, eps, PRO)[:, None], acc)
    skinny_finish(acc, pid_n, offs_n, offs_m, mask_n, mask_m, N, ws_ptr, lock_ptr,
                  scale_ptr, b_ptr, y_ptr, SPLIT_K, HAS_SCALE, HAS_BIAS)  # fmt: skip


@triton.jit
def _row(acc, ss, wf, row: tl.constexpr, x_ptr, r_ptr, h_ptr, g_ptr, offs_k, mask_k, pid_n,
         M, K, stride_xm, stride_rm, PRO: tl.constexpr, BLOCK_N: tl.constexpr,
         BLOCK_K: tl.constexpr, VEC: tl.constexpr):  # fmt: skip
    """One x row's tile through the prologue, times the widened weights wf `[BN, BK]`, into its
    partial sums. Rows past M re-read the last row: their sums are never stored."""
    i = tl.minimum(row, M - 1)
    zero = 0 * offs_k  # [BK]: the masks below as tensors (a scalar one trips the interpreter)
    write_h = ((pid_n + zero) == 0) & ((row + zero) < M)  # PRO_NORM: block 0 writes h
    x, ss = load_x(x_ptr + i * stride_xm + offs_k, r_ptr + i * stride_rm + offs_k,
                   h_ptr + i * K + offs_k, g_ptr + offs_k, mask_k, ss, write_h, K,
                   PRO)  # fmt: skip
    return _fma_fold(acc, wf, x.to(tl.float32), BLOCK_N, BLOCK_K, VEC), ss


@triton.jit
def _row_sum(acc, ss, K, eps, PRO: tl.constexpr):
    """A row's partial sums `[BN, BK / VEC]` reduced over K `[BN]` (PRO_NORM: times rstd)."""
    total = tl.sum(acc, axis=1)
    if PRO == PRO_NORM:
        total *= rstd_of(ss, K, eps, 0)
    return total


@triton.jit
def _fma_fold(acc, w, x, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, VEC: tl.constexpr):
    """acc `[BN, BK / VEC]` plus the products w `[BN, BK]` * x `[BK]`, VEC neighbours along
    K (one thread's) into each partial sum: a chain of VEC FMAs, split in halves by parity."""
    if VEC == 1:
        acc += w * x[None, :]
    else:
        w_even, w_odd = tl.split(tl.reshape(w, [BLOCK_N, BLOCK_K // 2, 2]))  # [BN, BK/2] each
        x_even, x_odd = tl.split(tl.reshape(x, [BLOCK_K // 2, 2]))  # [BK/2] each
        acc = _fma_fold(acc, w_even, x_even, BLOCK_N, BLOCK_K // 2, VEC // 2)
        acc = _fma_fold(acc, w_odd, x_odd, BLOCK_N, BLOCK_K // 2, VEC // 2)
    return acc
