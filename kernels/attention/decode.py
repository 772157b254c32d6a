"""Decode attention over the paged KV pool: one new query token per sequence, split-KV.

Stage 1 runs one program per (sequence, kv_head, split): it walks its slice of the sequence
through the page table, BLOCK_N keys at a time, for all Hq/Hkv query heads of the GQA group at
once (tl.dot with the group padded to 16 rows; a plain multiply-reduce when the group is one
head), and writes a partial output plus its log-sum-exp. Stage 2 merges the splits. An fp8 or
int8 pool has its own stage 1 (`decode_attention_quant`; with head_dim 128 on a recent GPU,
`decode_attention_gluon`), feeding the same merge. Launch configs: `decode_config`.
Splitting the keys is what fills the GPU when batch * kv_heads is small next to the SM count;
with one split (a large batch, or a short context) stage 1 writes the output and no merge runs.
Decode is memory bound: each K/V byte is read once, so the ceiling is bytes / copy bandwidth.
"""

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels.attention.decode_config import (
    GQA_CONFIG,
    MHA_CONFIG,
    DecodeConfig,
    decode_num_splits,
    default_quant_config,
)
from kernels.attention.decode_parts import load_group_q, split_range, store_split
from kernels.attention.decode_quant import decode_attention_quant_stage1
from kernels.attention.online_softmax import softmax_fold
from kernels.attention.split_merge import _decode_attention_merge_kernel
from kernels.kv.paging import check_page_table, padded_slots, tile_slots
from kernels.kv.store import QUANT_MAX, dequantize_ref, scale_strides, unscaled_pool
from kernels.pdl import pdl_args, pdl_wait, prefetch_rows_l2

LOG2E = 1.4426950408889634


@triton.jit
def _first_tile_to_l2(k_ptr, v_ptr, kv_indices_ptr, page_base, start, end, kvh, stride_kvs,
                      stride_kvh, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
                      BLOCK_N: tl.constexpr):
    """Ask L2 for the K/V rows of keys start .. start + BLOCK_N (up to `end`). Safe for the key
    the kernel before is storing: its store lands in L2 too."""
    if start < end:
        keys = tl.minimum(start + tl.arange(0, BLOCK_N), end - 1)  # [BLOCK_N] in range
        page = tl.load(kv_indices_ptr + page_base + keys // PAGE_SIZE)
        slot = page.to(tl.int64) * PAGE_SIZE + keys % PAGE_SIZE  # [BLOCK_N]
        rows = slot * stride_kvs + kvh * stride_kvh  # [BLOCK_N]
        prefetch_rows_l2(k_ptr, rows, 0, HEAD_DIM, HEAD_DIM)
        prefetch_rows_l2(v_ptr, rows, 0, HEAD_DIM, HEAD_DIM)


@triton.jit
def _decode_attention_kernel(
    q_ptr, k_ptr, v_ptr, kv_indptr_ptr, kv_indices_ptr, seq_lens_ptr,
    mid_o_ptr,  # [B, Hq, num_splits, HEAD_DIM] contiguous float32 (or o itself: one split)
    mid_lse_ptr,  # [B, Hq, num_splits] contiguous float32
    qk_scale,  # sm_scale * log2(e): the softmax runs in base 2
    num_splits, stride_qb, stride_qh,
    stride_kvs,  # k_buf and v_buf share strides
    stride_kvh,
    Q_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
    USE_DOT: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    # the step's lengths and page table are staged before its first kernel: read before the
    # PDL wait (`kernels.pdl`), as is the split's first tile of K/V into L2
    b, kvh, split, start, end, page_base = split_range(seq_lens_ptr, kv_indptr_ptr, num_splits,
                                                       BLOCK_N)
    if PDL:
        _first_tile_to_l2(k_ptr, v_ptr, kv_indices_ptr, page_base, start, end, kvh, stride_kvs,
                          stride_kvh, HEAD_DIM, PAGE_SIZE, BLOCK_N)
    pdl_wait(PDL)

    q, offs_h, mask_h, offs_d, mask_d = load_group_q(q_ptr, b, kvh, stride_qb, stride_qh, GROUP,
                                                     HEAD_DIM, BLOCK_H, BLOCK_D)
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)  # running max (base-2 logits)
    l_sum = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs_n, mask_n, slot = tile_slots(kv_indices_ptr, page_base, n0, end, PAGE_SIZE,
                                          BLOCK_N, True)
        mask_nd = mask_n[:, None] & mask_d[None, :]
        kv_offs = slot[:, None] * stride_kvs + kvh * stride_kvh + offs_d[None, :]
        k = tl.load(k_ptr + kv_offs, mask=mask_nd, other=0.0)  # [BLOCK_N, BLOCK_D]
        v = tl.load(v_ptr + kv_offs, mask=mask_nd, other=0.0)  # [BLOCK_N, BLOCK_D]
        if USE_DOT:
            qk = tl.dot(q, tl.trans(k))  # [BLOCK_H, BLOCK_N]
        else:  # BLOCK_H == 1
            qk = tl.sum(q.to(tl.float32) * k.to(tl.float32), 1)[None, :]  # [1, BLOCK_N]
        qk = tl.where(mask_n[None, :], qk * qk_scale, float("-inf"))
        m, l_sum, alpha, p = softmax_fold(qk, m, l_sum)  # p [BLOCK_H, BLOCK_N]
        if USE_DOT:
            pv = tl.dot(p.to(q.dtype), v)  # [BLOCK_H, BLOCK_D]
        else:
            pv = tl.sum(tl.sum(p, 0)[:, None] * v.to(tl.float32), 0)[None, :]  # [1, BLOCK_D]
        acc = acc * alpha[:, None] + pv

    store_split(acc, m, l_sum, mid_o_ptr, mid_lse_ptr, b, Q_HEADS, offs_h, split, num_splits,
                offs_d, mask_h, mask_d, HEAD_DIM, True)


def decode_attention(
    q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor, seq_lens: torch.Tensor, page_size: int, sm_scale: float, *,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
    num_splits: int | None = None, out: torch.Tensor | None = None,
    config: DecodeConfig | None = None,
) -> torch.Tensor:  # fmt: skip
    """Attention of one query token per sequence over its paged KV; returns o `[B, Hq, D]`.

    q `[B, Hq, D]` (any strides but the last); k_buf/v_buf `[num_slots, Hkv, D]` (same
    strides) with Hq a multiple of Hkv; kv_indptr `[B+1]` int32 and kv_indices `[nnz]`
    int32/int64 page ids (CSR); seq_lens `[B]` int32 tokens per sequence (0 gives zeros).
    An int8 pool needs k_scale/v_scale `[num_slots, Hkv]` float32 (sharing strides; those
    of `store_kv.scale_pairs` are read with one load a key); a
    float8_e4m3fn pool takes them, or None for unscaled codes (a per-tensor scale of 1).
    num_splits None picks `decode_num_splits` from seq_lens.max(), a host sync: pass it
    explicitly under CUDA graphs. `out` (contiguous, q's shape and dtype) receives o if given.
    `config` overrides the default launch knobs (`DecodeConfig`).
    """
    assert q.dim() == 3, f"q must be [B, Hq, D], got {tuple(q.shape)}"
    B, Hq, D = q.shape
    assert k_buf.dim() == 3 and k_buf.shape[2] == D, (
        f"k_buf {tuple(k_buf.shape)} must be [num_slots, Hkv, {D}]"
    )
    assert v_buf.shape == k_buf.shape and v_buf.dtype == k_buf.dtype, "v_buf must match k_buf"
    assert k_buf.stride() == v_buf.stride(), "k_buf and v_buf must share strides"
    assert q.stride(-1) == 1 and k_buf.stride(-1) == 1, "q, k_buf must be contiguous in head_dim"
    Hkv = k_buf.shape[1]
    assert Hq % Hkv == 0, f"query heads {Hq} not a multiple of kv heads {Hkv}"
    check_page_table(kv_indices, page_size, kv_indptr=(kv_indptr, B + 1), seq_lens=(seq_lens, B))
    quant = k_buf.dtype in QUANT_MAX
    if quant and not unscaled_pool(k_buf, k_scale, v_scale):
        scale_strides(k_buf, k_scale, v_scale)
    elif not quant:
        assert k_buf.dtype == q.dtype, f"pool dtype {k_buf.dtype} != q dtype {q.dtype}"
    out = output_buffer(out, (B, Hq, D), q)
    if B == 0:
        return out
    if num_splits is None:
        num_splits = decode_num_splits(B, Hkv, int(seq_lens.max()), quantized=quant)
    kv_indptr, kv_indices, seq_lens = (t.contiguous() for t in (kv_indptr, kv_indices, seq_lens))

    group = Hq // Hkv
    block_d = triton.next_power_of_2(D)
    if num_splits == 1:  # stage 1 normalizes its only split straight into out: no merge
        mid_o = out.view(B, Hq, 1, D)
    else:
        mid_o = torch.empty(B, Hq, num_splits, D, dtype=torch.float32, device=q.device)
    mid_lse = torch.empty(B, Hq, num_splits, dtype=torch.float32, device=q.device)
    if quant:
        config = config or default_quant_config(q, k_buf, page_size)
        if config.gluon:
            from kernels.attention.decode_gluon import decode_quant_gluon_stage1

            assert q.dtype != torch.float32, "the Gluon stage 1 takes a 16-bit q"
            decode_quant_gluon_stage1(
                q, k_buf, v_buf, k_scale, v_scale, kv_indptr, kv_indices, seq_lens, mid_o,
                mid_lse, page_size, sm_scale * LOG2E, config.block_n, config.num_stages,
            )  # fmt: skip
        else:
            decode_attention_quant_stage1(
                q, k_buf, v_buf, k_scale, v_scale, kv_indptr, kv_indices, seq_lens, mid_o,
                mid_lse, page_size, sm_scale * LOG2E, config,
            )  # fmt: skip
    else:
        config = config or (MHA_CONFIG if Hq == Hkv else GQA_CONFIG)
        use_dot = group > 1 if config.use_dot is None else config.use_dot
        assert use_dot or group == 1, "the multiply-reduce path handles one query head per group"
        _decode_attention_kernel[(B, Hkv, num_splits)](
            q, k_buf, v_buf, kv_indptr, kv_indices, seq_lens, mid_o, mid_lse,
            sm_scale * LOG2E, num_splits, q.stride(0), q.stride(1), k_buf.stride(0),
            k_buf.stride(1), Q_HEADS=Hq, GROUP=group, HEAD_DIM=D, PAGE_SIZE=page_size,
            USE_DOT=use_dot, BLOCK_N=config.block_n, BLOCK_D=block_d,
            BLOCK_H=max(16, triton.next_power_of_2(group)) if use_dot else 1,
            num_warps=config.num_warps, num_stages=config.num_stages, **pdl_args(q.device),
        )  # fmt: skip
    if num_splits > 1:
        merge_splits(mid_o, mid_lse, out, block_d)
    return out


def output_buffer(out: torch.Tensor | None, shape: tuple[int, ...],
                  q: torch.Tensor) -> torch.Tensor:
    """An attention launcher's output: `out` when given (checked: contiguous, of `shape` and
    q's dtype), else a new tensor of them on q's device."""
    if out is None:
        return torch.empty(shape, dtype=q.dtype, device=q.device)
    assert out.shape == shape and out.dtype == q.dtype and out.is_contiguous(), (
        f"out must be a contiguous {q.dtype} {shape}"
    )
    return out


def merge_splits(mid_o: torch.Tensor, mid_lse: torch.Tensor, out: torch.Tensor,
                 block_d: int) -> None:
    """Stage 2: merge float32 partials mid_o `[B, H, num_splits, D]` by their base-2
    log-sum-exps mid_lse `[B, H, num_splits]` into out `[B, H, D]` (contiguous), over
    `block_d` columns (`kernels.attention.split_merge`)."""
    B, H, num_splits, D = mid_o.shape
    _decode_attention_merge_kernel[(B * H,)](
        mid_o, mid_lse, out, num_splits, HEAD_DIM=D,
        BLOCK_S=triton.next_power_of_2(num_splits), BLOCK_D=block_d, **pdl_args(out.device),
    )  # fmt: skip


def decode_attention_ref(
    q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor, seq_lens: torch.Tensor, page_size: int, sm_scale: float, *,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
    max_seq_len: int | None = None,
) -> torch.Tensor:  # fmt: skip
    """Torch reference of `decode_attention`, in float32 (or q's wider dtype): one padded
    SDPA call over every sequence's slots (padding reads slot 0 and is masked; an empty
    sequence gives zeros).

    `max_seq_len` (a host int, at least every seq_lens entry) sizes the padding; None reads
    seq_lens.max(), a host sync.
    """
    B, Hq, D = q.shape
    Hkv = k_buf.shape[1]
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max()) if B else 0
    if max_seq_len == 0:
        return torch.zeros_like(q)
    slots, valid = padded_slots(kv_indptr, kv_indices, seq_lens, page_size, max_seq_len)  # [B, L]
    acc = torch.promote_types(q.dtype, torch.float32)
    k = dequantize_ref(k_buf[slots], None if k_scale is None else k_scale[slots]).to(acc)
    v = dequantize_ref(v_buf[slots], None if v_scale is None else v_scale[slots]).to(acc)
    # the G query heads sharing one KV head ride in SDPA's query-length dim: no K/V copy
    qg = q.to(acc).reshape(B, Hkv, Hq // Hkv, D)  # [B, Hkv, G, D]
    out = F.scaled_dot_product_attention(
        qg, k.transpose(1, 2), v.transpose(1, 2), attn_mask=valid[:, None, None, :], scale=sm_scale
    )  # [B, Hkv, G, D]
    out = torch.where(seq_lens[:, None, None, None] > 0, out, 0.0)  # all-masked rows are NaN
    return out.reshape(B, Hq, D).to(q.dtype)
