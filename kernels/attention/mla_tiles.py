"""Tiles of latent rows shared by MLA decode and MLA extend (`kernels.attention.mla_decode`,
`kernels.attention.mla_extend`): how a row block's queries and a tile's latent rows load (the
nope / c_kv columns, then the rope ones), and how a tile folds into the running softmax, one
tile serving every head as K (scores over all columns) and as V (its first DL columns)."""

import triton
import triton.language as tl

from kernels.attention.online_softmax import softmax_fold
from kernels.kv.paging import tile_slots


@triton.jit
def load_latent(rows, mask_rows, offs_l, mask_l, offs_r, mask_r, DL: tl.constexpr):
    """Rows at `rows` `[R, 1]` (pointers) split at column DL: (nope `[R, BLOCK_DL]`, rope
    `[R, BLOCK_DR]`), zero where mask_rows `[R]` is off or past their widths."""
    nope = tl.load(rows + offs_l[None, :], mask=mask_rows[:, None] & mask_l[None, :], other=0.0)
    mask_rr = mask_rows[:, None] & mask_r[None, :]
    rope = tl.load(rows + DL + offs_r[None, :], mask=mask_rr, other=0.0)
    return nope, rope


@triton.jit
def latent_softmax_step(
    q_nope, q_rope, c_kv, k_rope, row_scale, mask, m, l_sum, acc, qk_scale, QUANT: tl.constexpr
):
    """Fold one tile of latent rows into the running (max, sum, acc) of M query rows.

    q_nope [M, BLOCK_DL], q_rope [M, BLOCK_DR], c_kv [N, BLOCK_DL] (K's nope part and V),
    k_rope [N, BLOCK_DR], mask [M, N] or [1, N]; base-2 logits. When QUANT, c_kv and k_rope
    are 8-bit and row_scale [N] float32 their rows' scales. A row must see a key in the first
    tile it folds (m stays finite).
    """
    c_kv = c_kv.to(q_nope.dtype)  # exact for e4m3 and int8
    qk = tl.dot(q_nope, tl.trans(c_kv)) + tl.dot(q_rope, tl.trans(k_rope.to(q_nope.dtype)))
    if QUANT:
        qk = qk * row_scale[None, :]  # [M, N]
    qk = tl.where(mask, qk * qk_scale, float("-inf"))
    m_new, l_new, alpha, p = softmax_fold(qk, m, l_sum)  # p [M, N]
    if QUANT:
        p = p * row_scale[None, :]
    acc = acc * alpha[:, None] + tl.dot(p.to(c_kv.dtype), c_kv)  # [M, BLOCK_DL]
    return m_new, l_new, acc


@triton.jit
def paged_latent_tile(
    q_nope, q_rope, m, l_sum, acc, n0, end, kv_indices_ptr, page_base, kv_ptr, kv_scale_ptr,
    stride_kvs, offs_l, mask_l, offs_r, mask_r, qk_scale,
    DL: tl.constexpr, PAGE_SIZE: tl.constexpr, QUANT: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Keys n0 .. n0 + BLOCK_N (below `end`) of a sequence whose page ids start at entry
    page_base of kv_indices, read from the pool kv_ptr (row scales at kv_scale_ptr when QUANT)
    and folded into (m, l_sum, acc) by `latent_softmax_step`."""
    offs_n, mask_n, slot = tile_slots(kv_indices_ptr, page_base, n0, end, PAGE_SIZE, BLOCK_N,
                                      True)
    # c_kv [BLOCK_N, BLOCK_DL] is K's nope part and V; k_rope [BLOCK_N, BLOCK_DR]
    c_kv, k_rope = load_latent(kv_ptr + slot[:, None] * stride_kvs, mask_n, offs_l, mask_l,
                               offs_r, mask_r, DL)
    row_scale = offs_n  # unused unless QUANT
    if QUANT:
        row_scale = tl.load(kv_scale_ptr + slot, mask=mask_n, other=0.0)  # [BLOCK_N]
    return latent_softmax_step(q_nope, q_rope, c_kv, k_rope, row_scale, mask_n[None, :], m,
                               l_sum, acc, qk_scale, QUANT)
