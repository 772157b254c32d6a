"""Stage 1 of split-KV decode attention over an fp8 (e4m3) or int8 KV pool.

The quantized twin of `_decode_attention_kernel` (same grid, same partial outputs for the same
merge), shaped so that a byte of KV costs as little work as it can:

- a 16-bit q (fp16 or bf16) gets fp16 dots: e4m3 and int8 values are exact in fp16, e4m3
  widens to fp16 with one hardware conversion per pair (bf16 would take three), and q is
  scaled by `sm_scale * log2(e)` before its cast, so the dot yields base-2 logits up to the
  key scale (a float32 q keeps float32 dots);
- int8 is widened to fp16 without an int-to-float conversion: the byte x added to the bits
  0x6480 of fp16 1152.0 reads as 1152 + x (exact, the ulp at 1024 is 1), and the 1152 is
  taken back once per dot (1152 * sum(q) from the scores, 1152 * sum(p) from the values);
- the per-(slot, head) scales never touch a tile: k_scale multiplies its key's score, and
  v_scale its row's softmax weight (normalized by the tile's largest v_scale, so the fp16
  weights stay in [0, 1]); the tile's product is then multiplied back by that largest scale;
- with `DecodeConfig.words` the codes are loaded as 32-bit words (four codes each) and widened
  to fp16 by bit arithmetic on two codes at a time (`_unpack_words`; e4m3 lands as x * 2^-8,
  the 2^8 folded into the scales), so the dot operands come from 16-bit tiles: a cast of an
  8-bit tile is hoisted behind its shared-memory load, and V in `p @ v` (a transposed 8-bit B
  operand, which ldmatrix cannot serve) is then read one byte at a time;
- with `DecodeConfig.prefetch` the loop carries the next tile's codes and scales in
  registers, loaded before this tile's math, instead of leaving the loads to the pipeliner;
- an fp8 pool without scales (SCALED off: a per-tensor scale of 1) reads no scale, each
  key's scale being 1.
"""

import torch
import triton
import triton.language as tl

from kernels.attention.decode_parts import load_group_q, split_range, store_split
from kernels.attention.online_softmax import softmax_fold
from kernels.kv.paging import tile_slots
from kernels.pdl import pdl_args, pdl_wait

INT8_OFFSET = tl.constexpr(1152.0)  # fp16 bits 0x6480; 0x6480 + x for int8 x reads as 1152 + x


@triton.jit
def _widen(x, DOT_DTYPE: tl.constexpr, INT_OFFSET: tl.constexpr):
    """An 8-bit tile in DOT_DTYPE, exactly; int8 to fp16 as INT8_OFFSET + x when INT_OFFSET."""
    if INT_OFFSET:
        return (x.to(tl.int16) + 0x6480).to(tl.float16, bitcast=True)
    return x.to(DOT_DTYPE)


@triton.jit
def _unpack_words(w, INT8: tl.constexpr):
    """[N, W] int32 words of four 8-bit codes -> [N, 4W] fp16 by bit arithmetic, two codes per
    32-bit op: int8 x reads as INT8_OFFSET + x, e4m3 x as x * 2^-8 (its 7 low bits shifted into
    fp16's exponent and mantissa, the sign into fp16's; exact, subnormals included)."""
    w = w.to(tl.uint32, bitcast=True)
    if INT8:  # (byte ^ 0x80) | 0x6400 = 1024 + (x + 128)
        even = (w & 0x00FF00FF) ^ 0x64806480  # codes 0 and 2 as an fp16 pair
        odd = ((w >> 8) & 0x00FF00FF) ^ 0x64806480  # codes 1 and 3
    else:
        even = ((w & 0x00800080) << 8) | ((w << 7) & 0x3F803F80)
        odd = (w & 0x80008000) | ((w >> 1) & 0x3F803F80)
    c0 = (even & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True)  # [N, W]
    c2 = (even >> 16).to(tl.uint16).to(tl.float16, bitcast=True)
    c1 = (odd & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True)
    c3 = (odd >> 16).to(tl.uint16).to(tl.float16, bitcast=True)
    x = tl.join(tl.join(c0, c2), tl.join(c1, c3))  # [N, W, 2, 2]: [n, w, i, j] = code 2i + j
    return tl.reshape(x, [x.shape[0], 4 * x.shape[1]])  # [N, 4W]


@triton.jit
def _load_tile(
    k_ptr, v_ptr, k_scale_ptr, v_scale_ptr, kv_indices_ptr, page_base, n0, end, kvh,
    stride_kvs, stride_kvh, stride_ss, stride_sh,
    HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, PACK: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, SCALED: tl.constexpr,
):  # fmt: skip
    """Raw K/V codes `[BLOCK_N, BLOCK_D // PACK]` (PACK codes an element: int32 words when 4,
    bytes when 1), their scales `[BLOCK_N]` (1 unSCALED) and key mask for keys n0.. (masked
    from `end`)."""
    _, mask_n, slot = tile_slots(kv_indices_ptr, page_base, n0, end, PAGE_SIZE, BLOCK_N, True)
    offs_c = tl.arange(0, BLOCK_D // PACK)
    mask = mask_n[:, None] & (offs_c < HEAD_DIM // PACK)[None, :]
    offs = slot[:, None] * stride_kvs + kvh * stride_kvh + offs_c[None, :]
    k = tl.load(k_ptr + offs, mask=mask, other=0.0)  # [BLOCK_N, BLOCK_D // PACK]
    v = tl.load(v_ptr + offs, mask=mask, other=0.0)  # [BLOCK_N, BLOCK_D // PACK]
    if SCALED:
        s_offs = slot * stride_ss + kvh * stride_sh  # [BLOCK_N]
        k_s = tl.load(k_scale_ptr + s_offs, mask=mask_n, other=0.0)  # [BLOCK_N]
        v_s = tl.load(v_scale_ptr + s_offs, mask=mask_n, other=0.0)  # [BLOCK_N]
    else:
        k_s = tl.full([BLOCK_N], 1.0, tl.float32)
        v_s = k_s
    return k, v, k_s, v_s, mask_n


@triton.jit
def _decode_attention_quant_kernel(
    q_ptr,
    k_ptr, v_ptr,  # [num_slots, Hkv, HEAD_DIM] float8e4nv or int8 (int32 words when WORDS)
    k_scale_ptr, v_scale_ptr,  # [num_slots, Hkv] float32 (read only when SCALED)
    # the page table, outputs, scale and strides as in `_decode_attention_kernel`
    kv_indptr_ptr, kv_indices_ptr, seq_lens_ptr, mid_o_ptr, mid_lse_ptr, qk_scale, num_splits,
    stride_qb, stride_qh, stride_kvs, stride_kvh,
    stride_ss, stride_sh,  # k_scale and v_scale share strides
    Q_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
    DOT_DTYPE: tl.constexpr, INT_OFFSET: tl.constexpr, IS_INT: tl.constexpr, WORDS: tl.constexpr,
    PREFETCH: tl.constexpr, CODE_SCALE: tl.constexpr, SCALED: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pdl_wait(PDL)
    b, kvh, split, start, end, page_base = split_range(seq_lens_ptr, kv_indptr_ptr, num_splits,
                                                       BLOCK_N)
    # the group's query heads padded to BLOCK_H >= 16 rows
    q, offs_h, mask_h, offs_d, mask_d = load_group_q(q_ptr, b, kvh, stride_qb, stride_qh, GROUP,
                                                     HEAD_DIM, BLOCK_H, BLOCK_D)
    q = (q.to(tl.float32) * qk_scale).to(DOT_DTYPE)
    q_sum = tl.sum(q.to(tl.float32), 1)  # [BLOCK_H], what an int8 tile's offset adds per key

    m = tl.full([BLOCK_H], float("-inf"), tl.float32)  # running max (base-2 logits)
    l_sum = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    PACK: tl.constexpr = 4 if WORDS else 1
    if PREFETCH:  # the loop carries the next tile's codes, so its loads overlap this tile's math
        k_nx, v_nx, ks_nx, vs_nx, mask_nx = _load_tile(
            k_ptr, v_ptr, k_scale_ptr, v_scale_ptr, kv_indices_ptr, page_base, start, end, kvh,
            stride_kvs, stride_kvh, stride_ss, stride_sh, HEAD_DIM, PAGE_SIZE, PACK, BLOCK_N,
            BLOCK_D, SCALED,
        )  # fmt: skip
    for n0 in range(start, end, BLOCK_N):
        if PREFETCH:
            k, v, k_s, v_s, mask_n = k_nx, v_nx, ks_nx, vs_nx, mask_nx
            k_nx, v_nx, ks_nx, vs_nx, mask_nx = _load_tile(
                k_ptr, v_ptr, k_scale_ptr, v_scale_ptr, kv_indices_ptr, page_base, n0 + BLOCK_N,
                end, kvh, stride_kvs, stride_kvh, stride_ss, stride_sh, HEAD_DIM, PAGE_SIZE, PACK,
                BLOCK_N, BLOCK_D, SCALED,
            )  # fmt: skip
        else:
            k, v, k_s, v_s, mask_n = _load_tile(
                k_ptr, v_ptr, k_scale_ptr, v_scale_ptr, kv_indices_ptr, page_base, n0, end, kvh,
                stride_kvs, stride_kvh, stride_ss, stride_sh, HEAD_DIM, PAGE_SIZE, PACK, BLOCK_N,
                BLOCK_D, SCALED,
            )  # fmt: skip
        if WORDS:
            k = _unpack_words(k, IS_INT).to(DOT_DTYPE)  # [BLOCK_N, BLOCK_D]
            v = _unpack_words(v, IS_INT).to(DOT_DTYPE)  # [BLOCK_N, BLOCK_D]
            if IS_INT and not INT_OFFSET:  # float32 dots: take the offset back per element
                k -= INT8_OFFSET
                v -= INT8_OFFSET
        else:
            k = _widen(k, DOT_DTYPE, INT_OFFSET)  # [BLOCK_N, BLOCK_D]
            v = _widen(v, DOT_DTYPE, INT_OFFSET)  # [BLOCK_N, BLOCK_D]

        qk = tl.dot(q, tl.trans(k))  # [BLOCK_H, BLOCK_N]
        if INT_OFFSET:
            qk -= INT8_OFFSET * q_sum[:, None]
        qk = qk * (k_s * CODE_SCALE)[None, :]
        qk = tl.where(mask_n[None, :], qk, float("-inf"))
        m, l_sum, alpha, p = softmax_fold(qk, m, l_sum)  # p [BLOCK_H, BLOCK_N]
        # sum_n p_n (s_n v_n) = s_max sum_n (p_n s_n / s_max) v_n, weights in [0, 1]
        v_max = tl.maximum(tl.max(v_s, 0), 1e-30)
        p = (p * (v_s / v_max)[None, :]).to(DOT_DTYPE)
        pv = tl.dot(p, v)  # [BLOCK_H, BLOCK_D]
        if INT_OFFSET:
            pv -= INT8_OFFSET * tl.sum(p.to(tl.float32), 1)[:, None]
        pv = pv * (v_max * CODE_SCALE)
        acc = acc * alpha[:, None] + pv

    store_split(acc, m, l_sum, mid_o_ptr, mid_lse_ptr, b, Q_HEADS, offs_h, split, num_splits,
                offs_d, mask_h, mask_d, HEAD_DIM, True)


def decode_attention_quant_stage1(
    q, k_buf, v_buf, k_scale, v_scale, kv_indptr, kv_indices, seq_lens, mid_o, mid_lse,
    page_size: int, qk_scale: float, config,
) -> None:  # fmt: skip
    """Launch stage 1 over a quantized pool into `mid_o`/`mid_lse` (shapes as in
    `decode_attention`, which validates the inputs; with one split `mid_o` may be the output,
    `[B, Hq, 1, D]` in q's dtype); `config` is a `DecodeConfig`. k_scale and v_scale None: an
    unscaled fp8 pool."""
    B, Hq, D = q.shape
    Hkv = k_buf.shape[1]
    num_splits = mid_lse.shape[2]
    group = Hq // Hkv
    block_h = max(16, triton.next_power_of_2(group))
    block_d = triton.next_power_of_2(D)
    half = q.dtype in (torch.float16, torch.bfloat16)
    is_int = k_buf.dtype == torch.int8
    aligned = (D, *k_buf.stride()[:2], k_buf.storage_offset(), v_buf.storage_offset())
    words = config.words and all(n % 4 == 0 for n in aligned)  # else bytes
    if words:
        k_buf, v_buf = k_buf.view(torch.int32), v_buf.view(torch.int32)  # [S, Hkv, D // 4]
    scaled = k_scale is not None
    s_strides = (k_scale.stride(0), k_scale.stride(1)) if scaled else (0, 0)
    if not scaled:  # the kernel reads no scale: any pointer will do
        k_scale = v_scale = mid_lse
    _decode_attention_quant_kernel[(B, Hkv, num_splits)](
        q, k_buf, v_buf, k_scale, v_scale, kv_indptr, kv_indices, seq_lens, mid_o, mid_lse,
        qk_scale, num_splits, q.stride(0), q.stride(1), k_buf.stride(0), k_buf.stride(1),
        *s_strides,
        Q_HEADS=Hq, GROUP=group, HEAD_DIM=D, PAGE_SIZE=page_size,
        DOT_DTYPE=tl.float16 if half else tl.float32, INT_OFFSET=is_int and half,
        IS_INT=is_int, WORDS=words, PREFETCH=config.prefetch,
        CODE_SCALE=256.0 if words and not is_int else 1.0, SCALED=scaled,
        BLOCK_H=block_h, BLOCK_N=config.block_n, BLOCK_D=block_d,
        num_warps=config.num_warps, num_stages=config.num_stages, **pdl_args(q.device),
    )  # fmt: skip
