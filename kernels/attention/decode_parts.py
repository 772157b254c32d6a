"""The pieces every split-KV decode stage 1 shares (16-bit and quantized GQA, MLA): which keys
a program reads, the query rows of its head group, and how it writes its split's partial output
and log-sum-exp for the merge (`kernels.attention.split_merge`)."""

import triton
import triton.language as tl


@triton.jit
def split_range(seq_lens_ptr, kv_indptr_ptr, num_splits, TILE: tl.constexpr):
    """The program's sequence b (grid axis 0), head block (axis 1) and split (axis 2), and the
    split's keys start .. end: the sequence cut into num_splits runs of whole TILE-key tiles
    (the last splits may be short or empty). page_base: where its page ids start."""
    b = tl.program_id(0)
    heads = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    split_len = tl.cdiv(tl.cdiv(seq_len, num_splits), TILE) * TILE  # whole tiles per split
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)
    page_base = tl.load(kv_indptr_ptr + b)
    return b, heads, split, start, end, page_base


@triton.jit
def load_group_q(q_ptr, b, kvh, stride_qb, stride_qh, GROUP: tl.constexpr,
                 HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """Sequence b's q rows of the GROUP query heads sharing kv head kvh, padded to BLOCK_H
    rows: (q `[BLOCK_H, BLOCK_D]`, query heads `[BLOCK_H]` and their mask, offs_d and its
    mask below HEAD_DIM)."""
    offs_g = tl.arange(0, BLOCK_H)
    offs_h = kvh * GROUP + offs_g  # query heads of this group
    mask_h = offs_g < GROUP
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    q = tl.load(
        q_ptr + b * stride_qb + offs_h[:, None] * stride_qh + offs_d[None, :],
        mask=mask_h[:, None] & mask_d[None, :],
        other=0.0,
    )  # [BLOCK_H, BLOCK_D]
    return q, offs_h, mask_h, offs_d, mask_d


@triton.jit
def store_split(acc, m, l_sum, o_ptr, lse_ptr, b, heads, offs_h, split, num_splits, offs_d,
                mask_h, mask_d, HEAD_DIM: tl.constexpr, LSE: tl.constexpr):
    """Write a split's output acc / l_sum `[R, BLOCK_D]` for sequence b's query heads offs_h
    `[R]` (of `heads`) at o_ptr `[B, heads, num_splits, HEAD_DIM]` in its dtype, and (LSE) its
    base-2 log-sum-exp at lse_ptr `[B, heads, num_splits]`. An empty split (a short sequence)
    stores o = 0, lse = -inf: it gets zero weight in the merge. With one split and no merge to
    follow, o_ptr may be the output itself."""
    has_keys = l_sum > 0
    l_safe = tl.where(has_keys, l_sum, 1.0)
    o = acc / l_safe[:, None]
    lse = tl.where(has_keys, m + tl.log2(l_safe), float("-inf"))
    row = b * heads + offs_h  # [R] rows of lse_ptr, num_splits entries each
    mid = (row[:, None] * num_splits + split) * HEAD_DIM + offs_d[None, :]
    o = o.to(o_ptr.dtype.element_ty)
    tl.store(o_ptr + mid, o, mask=mask_h[:, None] & mask_d[None, :])
    if LSE:
        tl.store(lse_ptr + row * num_splits + split, lse, mask=mask_h)
