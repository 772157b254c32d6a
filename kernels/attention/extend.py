"""Extend (prefill with a cached prefix) attention for a varlen batch.

Sequence i has `prefix_lens[i]` tokens already in the pool (read through the page table) and
`qo_indptr[i+1] - qo_indptr[i]` new tokens whose q/k/v rows sit in `q`, `k_new`, `v_new`. Each
new token attends to the whole prefix and causally to the new tokens, reading those straight
from `k_new`/`v_new`, so the caller may store them into the pool before or after this call.
One program handles BLOCK_M rows: new tokens of one query head, or under GQA (packed) tokens
x the query heads of one kv head, so that a key tile serves the whole group. FlashAttention-
style online softmax over the prefix tiles, then over the new tiles up to the diagonal
(`kernels.attention.extend_tiles`); only the tiles that cross an edge (the prefix's last, the
diagonal's) are masked, the others load and score unmasked. The grid launches a (sequence,
head)'s row blocks side by side, so that they meet its keys in L2 together, except packed
programs over a cached prefix, which launch the sequences' blocks of one row range side by
side (faster there on the H200: `bench/results/kernels/2026-12-04-extend-launch-order-h200.md`).

An fp8 or int8 prefix is widened to fp16 in registers and scaled there: each code times its
(token, head) scale rounded to fp16 (int8 on the GPU by bit arithmetic: the code + 128 under
the exponent byte of 1024, minus 1152), and q meets it pre-scaled (sm_scale * log2 e) in
fp16. That is one fp16 multiply a value where a float32 dequantize also converted to float32
and rounded back to bf16, and fp16 keeps 3 more mantissa bits than bf16 (q, scaled, must
stay under fp16's 65504). A float32 q (the CPU) keeps the prefix in float32. An fp8 prefix
without scales (per-tensor scale 1) is scored on fp8 tensor cores where the GPU has them
(`fp8_scores`): each row of q is quantized to e4m3 by its own scale (amax / 448), which returns
on the scores; only V is widened, for `p @ v` in fp16. Else it is only widened.
"""

import torch
import triton
import triton.language as tl

from kernels.attention.extend_config import (
    ExtendConfig,
    default_extend_config,
    fp8_scores_default,
    rows_per_token,
)
from kernels.attention.extend_tiles import extend_range, new_tile, prefix_tile
from kernels.kv.paging import check_page_table
from kernels.kv.store import QUANT_MAX, scale_strides, unscaled_pool

LOG2E = 1.4426950408889634
GRID_YZ_MAX = 65535  # CUDA's limit on a grid's second and third axes (the first: 2^31 - 1)


@triton.jit
def _extend_attention_kernel(
    q_ptr, k_new_ptr, v_new_ptr, k_ptr, v_ptr,
    k_scale_ptr, v_scale_ptr,  # [num_slots, Hkv], read only when QUANT and SCALED
    o_ptr,  # [T, Q_HEADS, HEAD_DIM] contiguous
    qo_indptr_ptr, prefix_lens_ptr, kv_indptr_ptr, kv_indices_ptr,
    qk_scale,  # sm_scale * log2(e)
    stride_qt, stride_qh,
    stride_newt, stride_newh,  # k_new and v_new share strides
    stride_kvs, stride_kvh,  # k_buf and v_buf share strides
    stride_ss, stride_sh,  # k_scale and v_scale share strides
    Q_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
    ROWS: tl.constexpr,  # query heads a program packs per token: GROUP (one kv head's), or 1
    PREFIX: tl.constexpr,  # some sequence has a cached prefix (else its loop is compiled out)
    ROWS_FIRST: tl.constexpr,  # grid (row blocks, heads, sequences), else (sequences, ..., rows)
    QUANT: tl.constexpr, SCALED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    PREFIX_DTYPE: tl.constexpr,  # a quantized prefix's products: fp16, or float32 for fp32 q
    INT8_ASM: tl.constexpr,
    FP8_QK: tl.constexpr,  # an unscaled fp8 prefix's scores from q in e4m3 (fp8 tensor cores)
):  # fmt: skip
    if ROWS_FIRST:  # a (sequence, head)'s row blocks launch side by side
        mb, b = tl.program_id(0), tl.program_id(2)
    else:  # the sequences' blocks of one row range side by side
        b, mb = tl.program_id(0), tl.program_id(2)
    head0 = tl.program_id(1) * ROWS  # packed: the kv head's first query head
    kvh = head0 // GROUP

    q_start, new_len, active, prefix_len, new_end, page_base = extend_range(
        qo_indptr_ptr, prefix_lens_ptr, kv_indptr_ptr, b, mb, ROWS, BLOCK_M)

    rows = mb * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M]
    offs_m = rows // ROWS  # each row's new-token index within the sequence
    head = head0 + rows % ROWS  # and query head
    mask_m = offs_m < new_len
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    EVEN_D: tl.constexpr = BLOCK_D == HEAD_DIM
    q = tl.load(
        q_ptr + (q_start + offs_m)[:, None] * stride_qt + head[:, None] * stride_qh
        + offs_d[None, :],
        mask=mask_m[:, None] & mask_d[None, :],
        other=0.0,
    )  # [BLOCK_M, BLOCK_D]

    if FP8_QK:  # each row of q scaled to e4m3's largest value; its scale returns on the scores
        q_amax = tl.max(tl.abs(q.to(tl.float32)), 1)  # [BLOCK_M]
        q_scale = tl.where(q_amax > 0, q_amax / 448.0, 1.0)  # [BLOCK_M]
        q_prefix = (q.to(tl.float32) / q_scale[:, None]).to(k_ptr.dtype.element_ty)
        prefix_scale = (q_scale * qk_scale)[:, None]  # [BLOCK_M, 1]
    elif QUANT:  # q meets the widened prefix pre-scaled
        q_prefix = (q.to(tl.float32) * qk_scale).to(PREFIX_DTYPE)  # [BLOCK_M, BLOCK_D]
        prefix_scale = 1.0
    else:
        q_prefix = q
        prefix_scale = qk_scale
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    # cached prefix: full tiles unmasked, then the partial one
    if PREFIX:
        pages_ptr = kv_indices_ptr + page_base
        k_head, v_head = k_ptr + kvh * stride_kvh, v_ptr + kvh * stride_kvh
        ks_head, vs_head = k_scale_ptr + kvh * stride_sh, v_scale_ptr + kvh * stride_sh
        full = (prefix_len // BLOCK_N) * BLOCK_N
        for n0 in range(0, full, BLOCK_N):
            m, l_sum, acc = prefix_tile(
                q_prefix, prefix_scale, m, l_sum, acc, n0, prefix_len, pages_ptr, k_head, v_head,
                ks_head, vs_head, offs_d, mask_d, stride_kvs, stride_ss, PAGE_SIZE, QUANT, SCALED,
                PREFIX_DTYPE, INT8_ASM, FP8_QK, BLOCK_N, EVEN_D, MASK=False,
            )  # fmt: skip
        for n0 in range(full, prefix_len, BLOCK_N):
            m, l_sum, acc = prefix_tile(
                q_prefix, prefix_scale, m, l_sum, acc, n0, prefix_len, pages_ptr, k_head, v_head,
                ks_head, vs_head, offs_d, mask_d, stride_kvs, stride_ss, PAGE_SIZE, QUANT, SCALED,
                PREFIX_DTYPE, INT8_ASM, FP8_QK, BLOCK_N, EVEN_D, MASK=True,
            )  # fmt: skip

    # new tokens: the tiles wholly before this program's first row unmasked, then causal ones
    kn_head = k_new_ptr + q_start * stride_newt + kvh * stride_newh
    vn_head = v_new_ptr + q_start * stride_newt + kvh * stride_newh
    before = tl.where(active, (mb * BLOCK_M // ROWS // BLOCK_N) * BLOCK_N, 0)
    for n0 in range(0, before, BLOCK_N):
        m, l_sum, acc = new_tile(q, qk_scale, m, l_sum, acc, n0, offs_m, new_len, kn_head,
                                  vn_head, offs_d, mask_d, stride_newt, BLOCK_N, EVEN_D,
                                  MASK=False)  # fmt: skip
    for n0 in range(before, new_end, BLOCK_N):
        m, l_sum, acc = new_tile(q, qk_scale, m, l_sum, acc, n0, offs_m, new_len, kn_head,
                                  vn_head, offs_d, mask_d, stride_newt, BLOCK_N, EVEN_D,
                                  MASK=True)  # fmt: skip

    o = acc / tl.where(l_sum > 0, l_sum, 1.0)[:, None]
    o_offs = ((q_start + offs_m)[:, None] * Q_HEADS + head[:, None]) * HEAD_DIM + offs_d[None, :]
    tl.store(o_ptr + o_offs, o.to(o_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :])


def launch_grid(
    batch: int, head_programs: int, row_blocks: int, packed_prefix: bool
) -> tuple[tuple[int, int, int], bool]:
    """(grid, rows first) of the extend kernel: a (sequence, head)'s row blocks side by side
    on axis 0, unless packed programs read a cached prefix or the batch passes the limit of
    axes 1 and 2 (65535); then the sequences on axis 0 and the row blocks on axis 2."""
    rows_first = not packed_prefix and batch <= GRID_YZ_MAX
    grid = (row_blocks, head_programs, batch) if rows_first else (batch, head_programs, row_blocks)
    assert grid[2] <= GRID_YZ_MAX, (
        f"grid {grid}: {row_blocks} row blocks a (sequence, head) over CUDA's {GRID_YZ_MAX} on "
        "axis 2; split the batch's runs of new tokens into smaller chunks"
    )
    return grid, rows_first


def extend_attention(
    q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, k_buf: torch.Tensor,
    v_buf: torch.Tensor, qo_indptr: torch.Tensor, prefix_lens: torch.Tensor,
    kv_indptr: torch.Tensor, kv_indices: torch.Tensor, page_size: int, sm_scale: float, *,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
    max_new_len: int | None = None, max_prefix_len: int | None = None,
    config: ExtendConfig | None = None, fp8_scores: bool | None = None,
    pack_heads: bool | None = None,
) -> torch.Tensor:  # fmt: skip
    """Attention of a varlen batch's new tokens over prefix + themselves; o `[T, Hq, D]`.

    q `[T, Hq, D]` and k_new/v_new `[T, Hkv, D]` may be strided views (k_new and v_new with
    equal strides); sequence i's rows are `qo_indptr[i]:qo_indptr[i+1]` (int32 `[B+1]`). Its
    `prefix_lens[i]` (int32 `[B]`) cached tokens are read from k_buf/v_buf
    `[num_slots, Hkv, D]` through the CSR page table kv_indptr `[B+1]` int32 / kv_indices
    int32/int64 page ids. An int8 pool needs k_scale/v_scale `[num_slots, Hkv]` float32
    (sharing strides); a float8_e4m3fn pool takes them, or None for unscaled codes. max_new_len
    (the longest run of new tokens) sizes the grid; None reads it from qo_indptr, a host
    sync. max_prefix_len 0 (no sequence has a cached prefix) skips the pool: the 16-bit
    kernel and config whatever the pool holds; None: prefixes may be cached. config None: the
    default. fp8_scores (an fp8 pool without scales only): score the prefix on fp8 tensor
    cores, each row of q quantized to e4m3 with its own scale; None: on a GPU that has them
    (`fp8_scores_default`). pack_heads: a program's rows are tokens x the query heads of
    one kv head (each key tile loaded, and widened, once for the group), else tokens of one
    query head; None: packed under GQA.
    """
    assert q.dim() == 3, f"q must be [T, Hq, D], got {tuple(q.shape)}"
    T, Hq, D = q.shape
    assert k_new.dim() == 3 and k_new.shape[0] == T and k_new.shape[2] == D, (
        f"k_new {tuple(k_new.shape)} must be [{T}, Hkv, {D}]"
    )
    assert v_new.shape == k_new.shape, f"v_new {tuple(v_new.shape)} != k_new {tuple(k_new.shape)}"
    assert k_new.dtype == v_new.dtype == q.dtype, "q, k_new, v_new must share a dtype"
    Hkv = k_new.shape[1]
    assert Hq % Hkv == 0, f"query heads {Hq} not a multiple of kv heads {Hkv}"
    assert k_buf.dim() == 3 and k_buf.shape[1:] == (Hkv, D), (
        f"k_buf {tuple(k_buf.shape)} must be [num_slots, {Hkv}, {D}]"
    )
    assert v_buf.shape == k_buf.shape and v_buf.dtype == k_buf.dtype, "v_buf must match k_buf"
    assert k_new.stride() == v_new.stride(), "k_new and v_new must share strides"
    assert k_buf.stride() == v_buf.stride(), "k_buf and v_buf must share strides"
    for name, x in (("q", q), ("k_new", k_new), ("k_buf", k_buf)):
        assert x.stride(-1) == 1, f"{name} must be contiguous along head_dim"
    B = prefix_lens.shape[0]
    check_page_table(kv_indices, page_size, qo_indptr=(qo_indptr, B + 1),
                     prefix_lens=(prefix_lens, B), kv_indptr=(kv_indptr, B + 1))
    quant = k_buf.dtype in QUANT_MAX
    scaled = quant and not unscaled_pool(k_buf, k_scale, v_scale)
    if scaled:
        s_strides = scale_strides(k_buf, k_scale, v_scale)
    else:
        assert quant or k_buf.dtype == q.dtype, f"pool dtype {k_buf.dtype} != q dtype {q.dtype}"
        k_scale = v_scale = prefix_lens  # unused placeholders: no scale is read
        s_strides = (0, 0)
    unscaled = quant and not scaled
    if fp8_scores is None:  # fp8 tensor cores take 32 values of head_dim a step
        fp8_scores = unscaled and D >= 32 and fp8_scores_default(q.device)
    assert unscaled or not fp8_scores, "fp8_scores needs an fp8 pool without scales"
    prefix = max_prefix_len != 0
    if not prefix:  # nothing is read from the pool
        quant = scaled = fp8_scores = False
    o = torch.empty(T, Hq, D, dtype=q.dtype, device=q.device)
    if T == 0 or B == 0:
        return o
    if max_new_len is None:
        max_new_len = int((qo_indptr[1:] - qo_indptr[:-1]).max())
    rows = rows_per_token(Hq, Hkv, pack_heads)
    cfg = config or default_extend_config(D, quant, q.device, rows=max_new_len * rows)
    qo_indptr, prefix_lens, kv_indptr, kv_indices = (
        t.contiguous() for t in (qo_indptr, prefix_lens, kv_indptr, kv_indices)
    )
    row_blocks = triton.cdiv(max_new_len * rows, cfg.block_m)
    grid, rows_first = launch_grid(B, Hq // rows, row_blocks, packed_prefix=rows > 1 and prefix)
    _extend_attention_kernel[grid](
        q, k_new, v_new, k_buf, v_buf, k_scale, v_scale, o,
        qo_indptr, prefix_lens, kv_indptr, kv_indices, sm_scale * LOG2E,
        q.stride(0), q.stride(1), k_new.stride(0), k_new.stride(1),
        k_buf.stride(0), k_buf.stride(1), *s_strides,
        Q_HEADS=Hq, GROUP=Hq // Hkv, HEAD_DIM=D, PAGE_SIZE=page_size, ROWS=rows, PREFIX=prefix,
        ROWS_FIRST=rows_first, QUANT=quant, SCALED=scaled,
        PREFIX_DTYPE=tl.float32 if q.dtype == torch.float32 else tl.float16,
        INT8_ASM=k_buf.dtype == torch.int8 and q.dtype != torch.float32 and q.is_cuda,
        FP8_QK=fp8_scores,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=triton.next_power_of_2(D),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return o
