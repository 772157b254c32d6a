"""Key tiles of extend attention (`kernels.attention.extend`): each folds one tile of keys
into a program's running softmax (max, sum) and output accumulator; and the row block's range
of keys, shared with MLA extend. A prefix tile reads the
pool through the page table (widening fp8 / int8 codes with their scales in registers), a
new-token tile reads the new K/V rows; `MASK` off, a tile known to lie within bounds loads
and scores without masks."""

import triton
import triton.language as tl

from kernels.attention.online_softmax import softmax_fold
from kernels.kv.paging import tile_slots
from kernels.widen_ptx import WIDEN_INT8

INT8_TO_F16 = tl.constexpr(WIDEN_INT8)  # $2: 4 int8 codes -> $0, $1: 4 fp16


@triton.jit
def extend_range(qo_indptr_ptr, prefix_lens_ptr, kv_indptr_ptr, b, mb, ROWS, BLOCK_M):
    """Sequence b's new tokens (q_start, new_len) and what row block mb (BLOCK_M query rows,
    ROWS a token) reads of them: whether it holds a row (active), its prefix_len cached keys
    and the new keys below new_end (up to its last token: the causal bound), both 0 when it
    lies past the sequence's rows; page_base, where the sequence's page ids start."""
    q_start = tl.load(qo_indptr_ptr + b)
    new_len = tl.load(qo_indptr_ptr + b + 1) - q_start
    active = mb * BLOCK_M < new_len * ROWS  # programs past this sequence's rows do nothing
    prefix_len = tl.where(active, tl.load(prefix_lens_ptr + b), 0)
    last = ((mb + 1) * BLOCK_M - 1) // ROWS  # the program's last token
    new_end = tl.where(active, tl.minimum(new_len, last + 1), 0)  # causal bound
    page_base = tl.load(kv_indptr_ptr + b)
    return q_start, new_len, active, prefix_len, new_end, page_base


@triton.jit
def _softmax_step(q, k, mask, m, l_sum, qk_scale, MASK: tl.constexpr):
    """Scores of one key tile folded into the running (max, sum): base-2 logits, mask [M, N]
    applied where MASK (a full tile in bounds needs none). Returns (max, sum, alpha [M]: the
    rescale of what came before, weights p [M, N])."""
    qk = tl.dot(q, tl.trans(k.to(q.dtype))) * qk_scale  # [BLOCK_M, BLOCK_N]
    if MASK:
        qk = tl.where(mask, qk, float("-inf"))
    return softmax_fold(qk, m, l_sum)  # the max is finite: the first tile shows every row key 0


@triton.jit
def _widen(x, scale, DT: tl.constexpr, INT8_ASM: tl.constexpr):
    """Codes x [N, D] (fp8 or int8) times their rows' scale [N], in DT."""
    if INT8_ASM:
        x = tl.inline_asm_elementwise(INT8_TO_F16, "=r,=r,r", [x], dtype=tl.float16,
                                      is_pure=True, pack=4)  # fmt: skip
    return x.to(DT) * scale.to(DT)[:, None]


@triton.jit
def _load_rows(ptrs, rows_ok, mask_d, MASK: tl.constexpr, EVEN_D: tl.constexpr):
    """A tile [N, BLOCK_D] at ptrs: rows where rows_ok [N] if MASK, columns below head_dim."""
    if MASK:
        x = tl.load(ptrs, mask=rows_ok[:, None] & mask_d[None, :], other=0.0)
    elif EVEN_D:
        x = tl.load(ptrs)
    else:
        x = tl.load(ptrs, mask=mask_d[None, :], other=0.0)
    return x


@triton.jit
def prefix_tile(
    q_prefix, prefix_scale, m, l_sum, acc, n0, prefix_len,
    pages_ptr, k_ptr, v_ptr, k_scale_ptr, v_scale_ptr, offs_d, mask_d,
    stride_kvs, stride_ss,  # k_ptr / k_scale_ptr point at this kv head
    PAGE_SIZE: tl.constexpr, QUANT: tl.constexpr, SCALED: tl.constexpr,
    PREFIX_DTYPE: tl.constexpr, INT8_ASM: tl.constexpr, FP8_QK: tl.constexpr,
    BLOCK_N: tl.constexpr, EVEN_D: tl.constexpr, MASK: tl.constexpr,
):  # fmt: skip
    """Prefix keys n0 : n0 + BLOCK_N, read through the page table, folded into (m, l_sum, acc);
    MASK: the tile reaches past prefix_len (else every load and score is in bounds)."""
    _, mask_n, slot = tile_slots(pages_ptr, 0, n0, prefix_len, PAGE_SIZE, BLOCK_N, MASK)
    kv_offs = slot[:, None] * stride_kvs + offs_d[None, :]  # [BLOCK_N, BLOCK_D]
    k = _load_rows(k_ptr + kv_offs, mask_n, mask_d, MASK, EVEN_D)  # [BLOCK_N, BLOCK_D]
    v = _load_rows(v_ptr + kv_offs, mask_n, mask_d, MASK, EVEN_D)  # [BLOCK_N, BLOCK_D]
    if QUANT:
        if SCALED:
            if MASK:
                k_s = tl.load(k_scale_ptr + slot * stride_ss, mask=mask_n, other=0.0)
                v_s = tl.load(v_scale_ptr + slot * stride_ss, mask=mask_n, other=0.0)
            else:
                k_s = tl.load(k_scale_ptr + slot * stride_ss)  # [BLOCK_N]
                v_s = tl.load(v_scale_ptr + slot * stride_ss)
            k = _widen(k, k_s, PREFIX_DTYPE, INT8_ASM)  # [BLOCK_N, BLOCK_D]
            v = _widen(v, v_s, PREFIX_DTYPE, INT8_ASM)
        elif not FP8_QK:  # an unscaled fp8 prefix: its codes are the values
            k = k.to(PREFIX_DTYPE)
        v = v.to(PREFIX_DTYPE)
    m, l_sum, alpha, p = _softmax_step(q_prefix, k, mask_n[None, :], m, l_sum, prefix_scale,
                                       MASK)  # fmt: skip
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)  # [BLOCK_M, BLOCK_D]
    return m, l_sum, acc


@triton.jit
def new_tile(
    q, qk_scale, m, l_sum, acc, n0, offs_m, new_len, k_new_ptr, v_new_ptr, offs_d, mask_d,
    stride_newt, BLOCK_N: tl.constexpr, EVEN_D: tl.constexpr, MASK: tl.constexpr,
):  # fmt: skip
    """New keys n0 : n0 + BLOCK_N (k_new_ptr at this sequence's first token and kv head)
    folded into (m, l_sum, acc); MASK: the causal and length masks (a tile wholly before the
    program's first row needs neither)."""
    offs_n = n0 + tl.arange(0, BLOCK_N)
    mask_n = offs_n < new_len
    new_offs = offs_n[:, None] * stride_newt + offs_d[None, :]  # [BLOCK_N, BLOCK_D]
    k = _load_rows(k_new_ptr + new_offs, mask_n, mask_d, MASK, EVEN_D)  # [BLOCK_N, BLOCK_D]
    v = _load_rows(v_new_ptr + new_offs, mask_n, mask_d, MASK, EVEN_D)  # [BLOCK_N, BLOCK_D]
    causal = (offs_n[None, :] <= offs_m[:, None]) & mask_n[None, :]  # [BLOCK_M, BLOCK_N]
    m, l_sum, alpha, p = _softmax_step(q, k, causal, m, l_sum, qk_scale, MASK)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)  # [BLOCK_M, BLOCK_D]
    return m, l_sum, acc
