"""Stage 1 of split-KV decode attention over an fp8 (e4m3) or int8 pool, without tensor cores.

The "lanes" twin of `_decode_attention_quant_kernel` (same grid, same partial outputs for the
same merge). A program walks its keys BLOCK_N at a time, and key n0 + i of every tile belongs
to lane i: each lane keeps its own online softmax (running max, sum, and a float32 output row
per query head), so the loop has no reduction across the tile's keys at all, only the sum of
q . k over head_dim, which stays inside a warp. The lanes are merged once, after the loop.
Every code is widened in registers (e4m3 by the hardware's paired conversion, int8 as
INT8_OFFSET + x through fp16 bits, the offset taken back per lane), no tile passes through
shared memory, so many programs fit on an SM and their loads overlap. With `prefetch` the
loop carries the next tile's codes and scales, and the slots of the one after, so neither the
page-table lookup nor the codes' load waits behind a tile's math.

Per query head and lane the state is `m` (running max of base-2 logits), `l` (sum of
weights) and `acc` (sum of weight * v_scale * code); the key scale multiplies a key's score,
the value scale its weight.
"""

import triton
import triton.language as tl

INT8_OFFSET = tl.constexpr(1152.0)  # fp16 bits 0x6480; 0x6480 + x for int8 x reads as 1152 + x
NEG_BIG = tl.constexpr(-1.0e30)  # a lane's max before its first key: finite, so no inf - inf


@triton.jit
def _widen(x, IS_INT: tl.constexpr):
    """8-bit codes -> float32: e4m3 exactly, int8 as INT8_OFFSET + x (exactly)."""
    if IS_INT:
        return (x.to(tl.int16) + 0x6480).to(tl.float16, bitcast=True).to(tl.float32)
    return x.to(tl.float32)


@triton.jit
def _slots(kv_indices_ptr, page_base, n0, end, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):
    """Pool slots `[BLOCK_N]` (int64) of keys n0.., and their mask (keys from `end` are 0)."""
    offs_n = n0 + tl.arange(0, BLOCK_N)
    mask_n = offs_n < end
    page = tl.load(kv_indices_ptr + page_base + offs_n // PAGE_SIZE, mask=mask_n, other=0)
    return page.to(tl.int64) * PAGE_SIZE + offs_n % PAGE_SIZE, mask_n


@triton.jit
def _codes(k_ptr, v_ptr, k_scale_ptr, v_scale_ptr, slot, mask_n, kvh, stride_kvs, stride_kvh,
           KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    """Codes `[BLOCK_N, BLOCK_D]` of K and V at `slot`, and their scales `[BLOCK_N]`."""
    offs_d = tl.arange(0, BLOCK_D)
    mask = mask_n[:, None] & (offs_d < HEAD_DIM)[None, :]
    offs = slot[:, None] * stride_kvs + kvh * stride_kvh + offs_d[None, :]
    k = tl.load(k_ptr + offs, mask=mask, other=0.0)  # [BLOCK_N, BLOCK_D]
    v = tl.load(v_ptr + offs, mask=mask, other=0.0)  # [BLOCK_N, BLOCK_D]
    k_s = tl.load(k_scale_ptr + slot * KV_HEADS + kvh, mask=mask_n, other=0.0)  # [BLOCK_N]
    v_s = tl.load(v_scale_ptr + slot * KV_HEADS + kvh, mask=mask_n, other=0.0)  # [BLOCK_N]
    return k, v, k_s, v_s


@triton.jit
def _decode_attention_lanes_kernel(
    q_ptr,
    k_ptr,  # [num_slots, Hkv, HEAD_DIM] float8e4nv or int8; v the same
    v_ptr,
    k_scale_ptr,  # [num_slots, Hkv] contiguous float32
    v_scale_ptr,
    kv_indptr_ptr,
    kv_indices_ptr,
    seq_lens_ptr,
    mid_o_ptr,  # [B, Hq, num_splits, HEAD_DIM] contiguous float32 (or o itself: one split)
    mid_lse_ptr,  # [B, Hq, num_splits] contiguous float32
    qk_scale,  # sm_scale * log2(e): the softmax runs in base 2
    num_splits,
    stride_qb,
    stride_qh,
    stride_kvs,  # k_buf and v_buf share strides
    stride_kvh,
    Q_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    IS_INT: tl.constexpr,
    PREFETCH: tl.constexpr,
    HEADS_FIRST: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    KV_HEADS: tl.constexpr = Q_HEADS // GROUP
    if HEADS_FIRST:  # a sequence's kv heads run side by side: they share slots' cache lines
        kvh = tl.program_id(0)
        b = tl.program_id(1)
    else:
        b = tl.program_id(0)
        kvh = tl.program_id(1)
    split = tl.program_id(2)

    seq_len = tl.load(seq_lens_ptr + b)
    split_len = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N  # whole tiles per split
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)
    page_base = tl.load(kv_indptr_ptr + b)

    offs_g = tl.arange(0, BLOCK_G)
    offs_h = kvh * GROUP + offs_g  # query heads of this group
    mask_h = offs_g < GROUP
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    q = tl.load(
        q_ptr + b * stride_qb + offs_h[:, None] * stride_qh + offs_d[None, :],
        mask=mask_h[:, None] & mask_d[None, :],
        other=0.0,
    ).to(tl.float32)  # [BLOCK_G, BLOCK_D]
    q = q * qk_scale
    q_off = tl.sum(q, 1) * INT8_OFFSET  # [BLOCK_G]: what the int8 offset adds to each score

    m = tl.full([BLOCK_G, BLOCK_N], NEG_BIG, tl.float32)  # per head and lane
    l_sum = tl.zeros([BLOCK_G, BLOCK_N], tl.float32)
    w_sum = tl.zeros([BLOCK_G, BLOCK_N], tl.float32)  # sum of weight * v_scale (int8 offset)
    acc = tl.zeros([BLOCK_G, BLOCK_N, BLOCK_D], tl.float32)
    if PREFETCH:
        slot, mask_n = _slots(kv_indices_ptr, page_base, start, end, PAGE_SIZE, BLOCK_N)
        k_nx, v_nx, ks_nx, vs_nx = _codes(k_ptr, v_ptr, k_scale_ptr, v_scale_ptr, slot, mask_n,
                                          kvh, stride_kvs, stride_kvh, KV_HEADS, HEAD_DIM,
                                          BLOCK_D)  # fmt: skip
        mask_nx = mask_n
        slot_nx, mask_nx2 = _slots(kv_indices_ptr, page_base, start + BLOCK_N, end, PAGE_SIZE,
                                   BLOCK_N)  # fmt: skip
    for n0 in range(start, end, BLOCK_N):
        if PREFETCH:  # this tile's codes came with the last iteration; fetch the next tile's
            k, v, k_s, v_s, mask_n = k_nx, v_nx, ks_nx, vs_nx, mask_nx
            k_nx, v_nx, ks_nx, vs_nx = _codes(k_ptr, v_ptr, k_scale_ptr, v_scale_ptr, slot_nx,
                                              mask_nx2, kvh, stride_kvs, stride_kvh, KV_HEADS,
                                              HEAD_DIM, BLOCK_D)  # fmt: skip
            mask_nx = mask_nx2
            slot_nx, mask_nx2 = _slots(kv_indices_ptr, page_base, n0 + 2 * BLOCK_N, end,
                                       PAGE_SIZE, BLOCK_N)  # fmt: skip
        else:
            slot, mask_n = _slots(kv_indices_ptr, page_base, n0, end, PAGE_SIZE, BLOCK_N)
            k, v, k_s, v_s = _codes(
                k_ptr, v_ptr, k_scale_ptr, v_scale_ptr, slot, mask_n, kvh, stride_kvs, stride_kvh,
                KV_HEADS, HEAD_DIM, BLOCK_D,
            )  # fmt: skip
        kf = _widen(k, IS_INT)  # [BLOCK_N, BLOCK_D]
        qk = tl.sum(q[:, None, :] * kf[None, :, :], 2)  # [BLOCK_G, BLOCK_N]
        if IS_INT:
            qk -= q_off[:, None]
        qk = tl.where(mask_n[None, :], qk * k_s[None, :], float("-inf"))
        m_new = tl.maximum(m, qk)
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(qk - m_new)  # [BLOCK_G, BLOCK_N]
        l_sum = l_sum * alpha + p
        pw = p * v_s[None, :]  # [BLOCK_G, BLOCK_N]
        vf = _widen(v, IS_INT)  # [BLOCK_N, BLOCK_D]
        acc = acc * alpha[:, :, None] + pw[:, :, None] * vf[None, :, :]
        if IS_INT:
            w_sum = w_sum * alpha + pw
        m = m_new

    # merge the lanes: rescale each to the group's max; an empty split has l = 0 everywhere
    m_all = tl.max(m, 1)  # [BLOCK_G]
    scale = tl.exp2(m - m_all[:, None])  # [BLOCK_G, BLOCK_N]
    l_all = tl.sum(l_sum * scale, 1)  # [BLOCK_G]
    o = tl.sum(acc * scale[:, :, None], 1)  # [BLOCK_G, BLOCK_D]
    if IS_INT:
        o -= INT8_OFFSET * tl.sum(w_sum * scale, 1)[:, None]
    has_keys = l_all > 0
    l_safe = tl.where(has_keys, l_all, 1.0)
    o = o / l_safe[:, None]
    lse = tl.where(has_keys, m_all + tl.log2(l_safe), float("-inf"))
    row = b * Q_HEADS + offs_h  # [BLOCK_G] rows of mid_lse, num_splits entries each
    mid = (row[:, None] * num_splits + split) * HEAD_DIM + offs_d[None, :]
    # one split: mid_o is the output itself (q's dtype), and no merge follows
    o = o.to(mid_o_ptr.dtype.element_ty)
    tl.store(mid_o_ptr + mid, o, mask=mask_h[:, None] & mask_d[None, :])
    tl.store(mid_lse_ptr + row * num_splits + split, lse, mask=mask_h)


def decode_attention_lanes_stage1(
    q, k_buf, v_buf, k_scale, v_scale, kv_indptr, kv_indices, seq_lens, mid_o, mid_lse,
    page_size: int, qk_scale: float, config,
) -> None:  # fmt: skip
    """Launch the lanes stage 1 (arguments as `decode_attention_quant_stage1`); `config` is a
    `DecodeConfig` with `lanes` set (block_n keys a tile, one lane each)."""
    B, Hq, D = q.shape
    Hkv = k_buf.shape[1]
    num_splits = mid_lse.shape[2]
    group = Hq // Hkv
    grid = (Hkv, B, num_splits) if config.heads_first else (B, Hkv, num_splits)
    _decode_attention_lanes_kernel[grid](
        q, k_buf, v_buf, k_scale, v_scale, kv_indptr, kv_indices, seq_lens, mid_o, mid_lse,
        qk_scale, num_splits, q.stride(0), q.stride(1), k_buf.stride(0), k_buf.stride(1),
        Q_HEADS=Hq, GROUP=group, HEAD_DIM=D, PAGE_SIZE=page_size,
        IS_INT=not k_buf.dtype.is_floating_point, PREFETCH=config.prefetch,
        HEADS_FIRST=config.heads_first, BLOCK_G=triton.next_power_of_2(group),
        BLOCK_N=config.block_n, BLOCK_D=triton.next_power_of_2(D),
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
