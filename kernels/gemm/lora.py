"""Segmented gather matmuls of a batch that mixes LoRA adapters: for each token t whose
adapter sits in slot s, y[t] += (x[t] @ A[s]^T) @ B[s]^T; tokens of no adapter add nothing.

The tokens of a batch are grouped by slot: `order` lists the token indices of slot 0, then
of slot 1, ..., and slot s owns `order[indptr[s]:indptr[s + 1]]` (a segment). Two kernels
walk the segments, gathering their rows of x and scattering into y:

- shrink: tmp[t] = x[t] @ A[s]^T, tmp float32 `[T, n * R]`;
- expand: y[t, slice j] += tmp[t, j * R:(j + 1) * R] @ B[s, slice j]^T, in place.

A fused projection (q/k/v, gate/up) stacks its sub-projections: A holds the n sub-adapters'
`[R, in]` blocks one after the other, `[L, n * R, in]`, and B the outputs of slice j in
rows `offsets[j]:offsets[j + 1]`, `[L, out, R]`; slice j reads only its own R columns of
tmp. R is the padded rank (a smaller adapter's extra rows of A and columns of B are zero).

The grids cover every slot and the longest segment (`max_len`); programs past their
segment's end return at once, so the launch reads the segment bounds from the device and
a CUDA graph captured with `max_len` = its batch size replays any mix of adapters.
"""

import torch
import triton
import triton.language as tl

MAX_SLICES = 3  # q, k, v


@triton.jit
def _segment_rows(order_ptr, indptr_ptr, slot, pid_m, BLOCK_M: tl.constexpr):
    """The token rows of block `pid_m` of `slot`'s segment and their mask (all off past
    its end)."""
    start = tl.load(indptr_ptr + slot)
    end = tl.load(indptr_ptr + slot + 1)
    offs = start + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask = offs < end
    rows = tl.load(order_ptr + offs, mask=mask, other=0)  # [BM]
    return rows, mask


@triton.jit
def _rows_dot(l_ptrs, r_ptrs, m_mask, n_mask, K,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The fp32 product of a `[BM, K]` left operand and a `[K, BN]` right one read tile by
    tile from `l_ptrs` / `r_ptrs` (each advanced BLOCK_K along K), the left cast to the
    right's dtype; rows outside `m_mask` and columns outside `n_mask` read as 0."""
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_mask = offs_k < K - k0
        lhs = tl.load(l_ptrs, mask=m_mask[:, None] & k_mask[None, :], other=0.0)  # [BM, BK]
        rhs = tl.load(r_ptrs, mask=k_mask[:, None] & n_mask[None, :], other=0.0)  # [BK, BN]
        acc = tl.dot(lhs.to(rhs.dtype), rhs, acc)
        l_ptrs += BLOCK_K
        r_ptrs += BLOCK_K
    return acc


@triton.jit
def _lora_shrink_kernel(
    x_ptr, a_ptr, tmp_ptr, order_ptr, indptr_ptr,
    K, NR, stride_x, stride_as, stride_ar, stride_t,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """tmp[rows, n-block] = x[rows] @ A[slot, n-block]^T for one block of a segment."""
    slot = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_n = tl.program_id(2)
    if tl.load(indptr_ptr + slot) + pid_m * BLOCK_M >= tl.load(indptr_ptr + slot + 1):
        return
    rows, m_mask = _segment_rows(order_ptr, indptr_ptr, slot, pid_m, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < NR
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rows.to(tl.int64)[:, None] * stride_x + offs_k[None, :]  # [BM, BK]
    a_ptrs = a_ptr + slot * stride_as + offs_n[None, :] * stride_ar + offs_k[:, None]  # [BK, BN]
    acc = _rows_dot(x_ptrs, a_ptrs, m_mask, n_mask, K, BLOCK_M, BLOCK_N, BLOCK_K)  # [BM, BN]
    t_ptrs = tmp_ptr + rows.to(tl.int64)[:, None] * stride_t + offs_n[None, :]
    tl.store(t_ptrs, acc, mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _lora_expand_kernel(
    tmp_ptr, b_ptr, y_ptr, order_ptr, indptr_ptr,
    R, off1, off2, off3, num_blocks_n, stride_t, stride_bs, stride_bo, stride_y,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """y[rows, cols] += tmp[rows, j * R:(j + 1) * R] @ B[slot, cols]^T for one block of a
    segment and one column block of slice j (columns off_j .. off_{j+1}, off_0 = 0)."""
    slot = tl.program_id(0)
    pid_m = tl.program_id(1) // num_blocks_n
    pid_n = tl.program_id(1) % num_blocks_n
    j = tl.program_id(2)
    if tl.load(indptr_ptr + slot) + pid_m * BLOCK_M >= tl.load(indptr_ptr + slot + 1):
        return
    col0 = tl.where(j == 0, 0, tl.where(j == 1, off1, off2))
    col1 = tl.where(j == 0, off1, tl.where(j == 1, off2, off3))
    if col0 + pid_n * BLOCK_N >= col1:
        return
    rows, m_mask = _segment_rows(order_ptr, indptr_ptr, slot, pid_m, BLOCK_M)
    offs_n = col0 + pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < col1
    offs_k = tl.arange(0, BLOCK_K)
    t_ptrs = tmp_ptr + rows.to(tl.int64)[:, None] * stride_t + j * R + offs_k[None, :]  # [BM, BK]
    b_ptrs = b_ptr + slot * stride_bs + offs_n[None, :] * stride_bo + offs_k[:, None]  # [BK, BN]
    acc = _rows_dot(t_ptrs, b_ptrs, m_mask, n_mask, R, BLOCK_M, BLOCK_N, BLOCK_K)  # [BM, BN]
    y_ptrs = y_ptr + rows.to(tl.int64)[:, None] * stride_y + offs_n[None, :]
    mask = m_mask[:, None] & n_mask[None, :]
    y = tl.load(y_ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptrs, (y + acc).to(y_ptr.dtype.element_ty), mask=mask)


def _check_segments(order: torch.Tensor, indptr: torch.Tensor, slots: int) -> None:
    assert indptr.shape == (slots + 1,) and indptr.dtype == torch.int32, (
        f"indptr must be [{slots + 1}] int32, got {indptr.dtype} {tuple(indptr.shape)}")
    assert order.dim() == 1 and order.dtype == torch.int64, "order must be [N] int64"


def _block(n: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, triton.next_power_of_2(n)))


def lora_shrink(x: torch.Tensor, a: torch.Tensor, order: torch.Tensor, indptr: torch.Tensor,
                max_len: int) -> torch.Tensor:
    """tmp `[T, n * R]` float32 with tmp[t] = x[t] @ a[s]^T for every token t of slot s's
    segment (x `[T, in]`, a `[L, n * R, in]`); the rows of tokens in no segment are left
    unset. `max_len` bounds the longest segment (it sizes the grid)."""
    T, K = x.shape
    L, NR, ka = a.shape
    assert ka == K, f"a {tuple(a.shape)} does not take x {tuple(x.shape)}"
    assert x.stride(1) == 1 and a.stride(2) == 1, "x and a must be contiguous in `in`"
    _check_segments(order, indptr, L)
    tmp = torch.empty(T, NR, dtype=torch.float32, device=x.device)
    if T == 0 or max_len == 0:
        return tmp
    bm, bn, bk = 16, _block(NR, 16, 64), _block(K, 16, 128)
    grid = (L, triton.cdiv(max_len, bm), triton.cdiv(NR, bn))
    _lora_shrink_kernel[grid](
        x, a, tmp, order, indptr, K, NR, x.stride(0), a.stride(0), a.stride(1), tmp.stride(0),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
    )  # fmt: skip
    return tmp


def lora_expand(y: torch.Tensor, tmp: torch.Tensor, b: torch.Tensor, order: torch.Tensor,
                indptr: torch.Tensor, max_len: int, slices: tuple[int, ...]) -> None:
    """y[t, slice j] += tmp[t, j * R:(j + 1) * R] @ b[s, slice j]^T in place, for every
    token t of slot s's segment: y `[T, out]`, tmp `[T, n * R]` (from `lora_shrink`),
    b `[L, out, R]`; `slices` are the n output widths, summing to out."""
    T, out = y.shape
    L, ob, R = b.shape
    assert 1 <= len(slices) <= MAX_SLICES and sum(slices) == out == ob, (
        f"slices {slices} must split y's {out} and b's {ob} columns")
    assert tmp.shape == (T, len(slices) * R) and tmp.dtype == torch.float32, (
        f"tmp must be [{T}, {len(slices) * R}] float32, got {tmp.dtype} {tuple(tmp.shape)}")
    assert y.stride(1) == 1 and b.stride(2) == 1 and tmp.stride(1) == 1, "inner dims contiguous"
    _check_segments(order, indptr, L)
    if T == 0 or max_len == 0:
        return
    offs = [sum(slices[:i + 1]) for i in range(len(slices))]
    offs += [offs[-1]] * (MAX_SLICES - len(offs))  # empty slices past the last
    bm, bn, bk = 16, _block(max(slices), 16, 64), _block(R, 16, 64)
    blocks_n = triton.cdiv(max(slices), bn)
    grid = (L, triton.cdiv(max_len, bm) * blocks_n, len(slices))
    _lora_expand_kernel[grid](
        tmp, b, y, order, indptr, R, *offs, blocks_n, tmp.stride(0), b.stride(0), b.stride(1),
        y.stride(0), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
    )  # fmt: skip


def lora_shrink_ref(x: torch.Tensor, a: torch.Tensor, order: torch.Tensor,
                    indptr: list[int]) -> torch.Tensor:
    """Torch reference of `lora_shrink`, in float32, over the segments of a host `indptr`;
    rows in no segment are zero."""
    tmp = torch.zeros(x.shape[0], a.shape[1], dtype=torch.float32, device=x.device)
    for slot, (lo, hi) in enumerate(zip(indptr, indptr[1:])):
        if hi > lo:
            rows = order[lo:hi]  # [n]
            tmp[rows] = x[rows].float() @ a[slot].float().t()  # [n, n * R]
    return tmp


def lora_expand_ref(y: torch.Tensor, tmp: torch.Tensor, b: torch.Tensor, order: torch.Tensor,
                    indptr: list[int], slices: tuple[int, ...]) -> None:
    """Torch reference of `lora_expand` (in place, float32 products), over the segments of
    a host `indptr`."""
    R = b.shape[2]
    for slot, (lo, hi) in enumerate(zip(indptr, indptr[1:])):
        if hi == lo:
            continue
        rows = order[lo:hi]  # [n]
        col = 0
        for j, width in enumerate(slices):
            delta = tmp[rows, j * R:(j + 1) * R] @ b[slot, col:col + width].float().t()  # [n, w]
            y[rows, col:col + width] = (y[rows, col:col + width].float() + delta).to(y.dtype)
            col += width
