"""Merging split-KV decode partials: a second kernel, or stage 1 itself.

`_decode_attention_merge_kernel` runs one program per (sequence, query head) over every
split's partial output and log-sum-exp. `_merge_if_last` does the same work inside stage 1:
each stage-1 program of a (sequence, kv head) stores its partial output and log-sum-exp, then
counts itself done on that pair's counter. The program that brings the count to num_splits
reads every split's partial and writes the normalized output, then sets the counter back to
zero for the next launch. This saves the merge kernel's launch, which at small batch costs
more than its work. The other programs' partials were written by other SMs: the count is an
acquire-release atomic at GPU scope, and the partials are read from L2 (`.cg`).
"""

import triton
import triton.language as tl


@triton.jit
def _merge_if_last(
    counter_ptr,  # this (sequence, kv head)'s int32 counter, zero before the launch
    mid_o_ptr,  # [B, Hq, num_splits, HEAD_DIM] float32
    mid_lse_ptr,  # [B, Hq, num_splits] float32
    o_ptr,  # [B, Hq, HEAD_DIM] contiguous
    row,  # [BLOCK_H] b * Hq + query head
    mask_h,
    num_splits,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    tl.debug_barrier()  # every thread's partial is stored before the count says so
    done = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    if done == num_splits - 1:
        tl.store(counter_ptr, 0)
        offs_d = tl.arange(0, BLOCK_D)
        mask = mask_h[:, None] & (offs_d[None, :] < HEAD_DIM)  # [BLOCK_H, BLOCK_D]
        m = tl.full([BLOCK_H], float("-inf"), tl.float32)
        for s in range(0, num_splits):
            lse = tl.load(mid_lse_ptr + row * num_splits + s, mask=mask_h,
                          other=float("-inf"), cache_modifier=".cg")  # [BLOCK_H]
            m = tl.maximum(m, lse)
        m = tl.where(m == float("-inf"), 0.0, m)  # no keys at all: every weight is zero
        total = tl.zeros([BLOCK_H], tl.float32)
        acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
        for s in range(0, num_splits):
            lse = tl.load(mid_lse_ptr + row * num_splits + s, mask=mask_h,
                          other=float("-inf"), cache_modifier=".cg")  # [BLOCK_H]
            w = tl.exp2(lse - m)  # [BLOCK_H]
            part = tl.load(mid_o_ptr + (row[:, None] * num_splits + s) * HEAD_DIM
                           + offs_d[None, :], mask=mask, other=0.0, cache_modifier=".cg")
            total += w
            acc += w[:, None] * part  # [BLOCK_H, BLOCK_D]
        o = acc / tl.where(total > 0, total, 1.0)[:, None]
        dst = o_ptr + row[:, None] * HEAD_DIM + offs_d[None, :]
        tl.store(dst, o.to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _decode_attention_merge_kernel(
    mid_o_ptr,
    mid_lse_ptr,
    o_ptr,  # [B, Hq, HEAD_DIM] contiguous
    num_splits,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0)  # b * Hq + h
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    mask_s = offs_s < num_splits
    mask_d = offs_d < HEAD_DIM
    lse = tl.load(mid_lse_ptr + row * num_splits + offs_s, mask=mask_s, other=float("-inf"))
    parts = tl.load(
        mid_o_ptr + (row * num_splits + offs_s[:, None]) * HEAD_DIM + offs_d[None, :],
        mask=mask_s[:, None] & mask_d[None, :],
        other=0.0,
    )  # [BLOCK_S, BLOCK_D]
    m = tl.max(lse, 0)
    w = tl.exp2(lse - tl.where(m == float("-inf"), 0.0, m))  # [BLOCK_S]; all zero if no keys
    total = tl.sum(w, 0)
    o = tl.sum(w[:, None] * parts, 0) / tl.where(total > 0, total, 1.0)  # [BLOCK_D]
    tl.store(o_ptr + row * HEAD_DIM + offs_d, o.to(o_ptr.dtype.element_ty), mask=mask_d)
