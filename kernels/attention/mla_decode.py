"""Multi-head latent attention (MLA) decode over a paged latent pool, in the absorbed form.

Each token stores one latent row per layer, `[c_kv (Dl) | rotated rope key (Dr)]`. The query
arrives absorbed: its nope part already multiplied by W_UK (Dl wide), then its rope part (Dr).
Attention is then MQA over the latent rows: every head scores `q . row` over all Dl + Dr
columns and sums the first Dl columns (V = c_kv); the model applies W_UV afterwards.

Stage 1 runs one program per (sequence, group of BLOCK_H heads, split): it walks its slice of
the sequence through the page table BLOCK_N rows at a time and loads each latent tile once for
the whole head group, using the same tile as K (scores, with the rope columns) and as V (the
Dl columns). Decode is memory bound on those rows, (Dl + Dr) * 2 bytes per token in 16 bits.
Stage 2 is `decode_attention`'s merge. With one split, stage 1 writes the output directly: the
float32 partials of H heads x Dl columns would otherwise add traffic comparable to the rows.

An fp8 (e4m3) or int8 pool keeps one float32 scale per row (`store_kv`'s layout for one KV
head). Its values widen exactly to q's dtype and the scale never touches a tile: it multiplies
its row's score and its row's softmax weight.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels.attention.decode import LOG2E, _decode_attention_merge_kernel, decode_num_splits
from kernels.kv.store import QUANT_MAX, dequantize_ref
from kernels.pdl import pdl_args


@dataclass(frozen=True)
class MlaDecodeConfig:
    """Launch knobs of the stage-1 kernel (bench/kernels/mla.py --sweep searches them).

    The default is the one whose sm_90 build keeps its [block_h, Dl] float32 accumulator and
    both dot operands in registers without spilling (160 registers a thread for a 16-bit pool,
    238 for fp8, at Dl 512); 4 warps needs 249 (and spills with fp8), 64 heads a block spills.
    """

    block_h: int = 16
    block_n: int = 32
    num_warps: int = 8
    num_stages: int = 2

    def __post_init__(self):
        for name in ("block_h", "block_n"):
            n = getattr(self, name)
            assert n >= 16 and n & (n - 1) == 0, f"{name} {n} must be a power of two >= 16"


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
    m_new = tl.maximum(m, tl.max(qk, 1))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(qk - m_new[:, None])  # [M, N]
    l_new = l_sum * alpha + tl.sum(p, 1)
    if QUANT:
        p = p * row_scale[None, :]
    acc = acc * alpha[:, None] + tl.dot(p.to(c_kv.dtype), c_kv)  # [M, BLOCK_DL]
    return m_new, l_new, acc


@triton.jit(do_not_specialize=["num_splits", "heads"])  # one compile for any split count
def _mla_decode_kernel(
    q_ptr,
    kv_ptr,
    kv_scale_ptr,  # [num_slots] float32, read only when QUANT
    kv_indptr_ptr,
    kv_indices_ptr,
    seq_lens_ptr,
    o_ptr,  # [B, heads, num_splits, DL] float32 partials, or [B, heads, DL] when DIRECT
    lse_ptr,  # [B, heads, num_splits] float32, unused when DIRECT
    qk_scale,  # sm_scale * log2(e): the softmax runs in base 2
    num_splits,
    stride_qb,
    stride_qh,
    stride_kvs,
    heads,
    DL: tl.constexpr,
    DR: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    QUANT: tl.constexpr,
    DIRECT: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_DL: tl.constexpr,
    BLOCK_DR: tl.constexpr,
):
    b = tl.program_id(0)
    hg = tl.program_id(1)
    split = tl.program_id(2)

    seq_len = tl.load(seq_lens_ptr + b)
    split_len = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N  # whole tiles per split
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)
    page_base = tl.load(kv_indptr_ptr + b)

    offs_h = hg * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < heads
    offs_l = tl.arange(0, BLOCK_DL)
    mask_l = offs_l < DL
    offs_r = tl.arange(0, BLOCK_DR)
    mask_r = offs_r < DR
    q_rows = q_ptr + b * stride_qb + offs_h[:, None] * stride_qh
    mask_hl = mask_h[:, None] & mask_l[None, :]
    q_nope = tl.load(q_rows + offs_l[None, :], mask=mask_hl, other=0.0)  # [BLOCK_H, BLOCK_DL]
    mask_hr = mask_h[:, None] & mask_r[None, :]
    q_rope = tl.load(q_rows + DL + offs_r[None, :], mask=mask_hr, other=0.0)  # [BLOCK_H, BLOCK_DR]

    m = tl.full([BLOCK_H], float("-inf"), tl.float32)  # running max (base-2 logits)
    l_sum = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DL], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        page = tl.load(kv_indices_ptr + page_base + offs_n // PAGE_SIZE, mask=mask_n, other=0)
        slot = page.to(tl.int64) * PAGE_SIZE + offs_n % PAGE_SIZE  # [BLOCK_N]
        rows = kv_ptr + slot[:, None] * stride_kvs
        # c_kv [BLOCK_N, BLOCK_DL] is K's nope part and V; k_rope [BLOCK_N, BLOCK_DR]
        c_kv = tl.load(rows + offs_l[None, :], mask=mask_n[:, None] & mask_l[None, :], other=0.0)
        mask_nr = mask_n[:, None] & mask_r[None, :]
        k_rope = tl.load(rows + DL + offs_r[None, :], mask=mask_nr, other=0.0)
        row_scale = offs_n  # unused unless QUANT
        if QUANT:
            row_scale = tl.load(kv_scale_ptr + slot, mask=mask_n, other=0.0)  # [BLOCK_N]
        m, l_sum, acc = latent_softmax_step(
            q_nope, q_rope, c_kv, k_rope, row_scale, mask_n[None, :], m, l_sum, acc, qk_scale,
            QUANT,
        )

    # An empty split (short sequence) stores o = 0, lse = -inf: it gets zero weight in the merge.
    has_keys = l_sum > 0
    l_safe = tl.where(has_keys, l_sum, 1.0)
    o = acc / l_safe[:, None]  # [BLOCK_H, BLOCK_DL]
    row = b * heads + offs_h  # [BLOCK_H]
    if DIRECT:
        tl.store(o_ptr + row[:, None] * DL + offs_l[None, :], o.to(o_ptr.dtype.element_ty), mask_hl)
    else:
        lse = tl.where(has_keys, m + tl.log2(l_safe), float("-inf"))
        mid = (row[:, None] * num_splits + split) * DL + offs_l[None, :]
        tl.store(o_ptr + mid, o, mask=mask_hl)
        tl.store(lse_ptr + row * num_splits + split, lse, mask=mask_h)


def check_pool_scale(
    kv_pool: torch.Tensor, kv_scale: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor:
    """Check a latent pool against q's dtype; returns the scale tensor the kernel reads (a
    placeholder for a 16-bit pool)."""
    if kv_pool.dtype not in QUANT_MAX:
        assert kv_pool.dtype == dtype, f"pool dtype {kv_pool.dtype} != q dtype {dtype}"
        return kv_pool  # unused: QUANT is off
    assert kv_scale is not None and kv_scale.shape == (kv_pool.shape[0], 1), (
        f"a {kv_pool.dtype} pool needs kv_scale float32 [{kv_pool.shape[0]}, 1]"
    )
    assert kv_scale.dtype == torch.float32 and kv_scale.is_contiguous(), (
        "kv_scale must be contiguous float32"
    )
    return kv_scale


def mla_decode_num_splits(batch: int, heads: int, max_seq_len: int, block_h: int = 16) -> int:
    """Splits per sequence for `mla_decode`: `decode_num_splits` over the head groups.

    Exposed so a CUDA-graph caller can fix the split count from host-side lengths.
    """
    return decode_num_splits(batch, triton.cdiv(heads, block_h), max_seq_len)


def mla_decode(
    q: torch.Tensor,
    kv_pool: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    sm_scale: float,
    *,
    kv_lora_rank: int = 512,
    kv_scale: torch.Tensor | None = None,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
    config: MlaDecodeConfig | None = None,
) -> torch.Tensor:
    """MLA attention of one absorbed query token per sequence over its latent rows; returns
    o `[B, H, Dl]` in q's dtype (before W_UV).

    q `[B, H, Dl + Dr]` (q_nope @ W_UK, then q_rope; any strides but the last); kv_pool
    `[num_slots, 1, Dl + Dr]` of q's dtype, one layer's latent rows (c_kv, then the rotated
    rope key); Dl = kv_lora_rank. kv_indptr `[B+1]` int32 and kv_indices `[nnz]` int32/int64
    page ids (CSR), seq_lens `[B]` int32 (0 gives zeros), page_size as `decode_attention`.
    A float8_e4m3fn or int8 pool needs kv_scale `[num_slots, 1]` float32 (contiguous).
    num_splits None picks `mla_decode_num_splits` from seq_lens.max(), a host sync: pass it
    explicitly under CUDA graphs. `out` (contiguous `[B, H, Dl]`, q's dtype) receives o if given.
    """
    assert q.dim() == 3, f"q must be [B, H, Dl + Dr], got {tuple(q.shape)}"
    B, H, D = q.shape
    Dl, Dr = kv_lora_rank, D - kv_lora_rank
    assert Dr > 0, f"q width {D} must exceed kv_lora_rank {Dl} (the rope part)"
    assert kv_pool.dim() == 3 and kv_pool.shape[1:] == (1, D), (
        f"kv_pool {tuple(kv_pool.shape)} must be [num_slots, 1, {D}]"
    )
    assert q.stride(-1) == 1 and kv_pool.stride(-1) == 1, "q, kv_pool must be contiguous in D"
    kv_scale = check_pool_scale(kv_pool, kv_scale, q.dtype)
    assert kv_indptr.shape == (B + 1,) and kv_indptr.dtype == torch.int32, (
        f"kv_indptr must be int32 [{B + 1}], got {kv_indptr.dtype} {tuple(kv_indptr.shape)}"
    )
    assert kv_indices.dim() == 1 and kv_indices.dtype in (torch.int32, torch.int64), (
        f"kv_indices must be 1-D int32/int64, got {kv_indices.dtype} {tuple(kv_indices.shape)}"
    )
    assert seq_lens.shape == (B,) and seq_lens.dtype == torch.int32, (
        f"seq_lens must be int32 [{B}], got {seq_lens.dtype} {tuple(seq_lens.shape)}"
    )
    assert page_size >= 1, f"page_size {page_size} must be positive"
    if out is None:
        out = torch.empty(B, H, Dl, dtype=q.dtype, device=q.device)
    assert out.shape == (B, H, Dl) and out.dtype == q.dtype and out.is_contiguous(), (
        f"out must be a contiguous {q.dtype} {(B, H, Dl)}"
    )
    if B == 0:
        return out
    config = config or MlaDecodeConfig()
    if num_splits is None:
        num_splits = mla_decode_num_splits(B, H, int(seq_lens.max()), config.block_h)
    kv_indptr, kv_indices, seq_lens = (t.contiguous() for t in (kv_indptr, kv_indices, seq_lens))

    direct = num_splits == 1
    if direct:
        dst, lse = out, out  # lse unused
    else:
        dst = torch.empty(B, H, num_splits, Dl, dtype=torch.float32, device=q.device)
        lse = torch.empty(B, H, num_splits, dtype=torch.float32, device=q.device)
    block_dl = max(16, triton.next_power_of_2(Dl))
    _mla_decode_kernel[(B, triton.cdiv(H, config.block_h), num_splits)](
        q, kv_pool, kv_scale, kv_indptr, kv_indices, seq_lens, dst, lse, sm_scale * LOG2E,
        num_splits, q.stride(0), q.stride(1), kv_pool.stride(0), heads=H, DL=Dl, DR=Dr,
        PAGE_SIZE=page_size, QUANT=kv_pool.dtype in QUANT_MAX, DIRECT=direct,
        BLOCK_H=config.block_h, BLOCK_N=config.block_n, BLOCK_DL=block_dl,
        BLOCK_DR=max(16, triton.next_power_of_2(Dr)),
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    if not direct:
        _decode_attention_merge_kernel[(B * H,)](
            dst, lse, out, num_splits, HEAD_DIM=Dl,
            BLOCK_S=triton.next_power_of_2(num_splits), BLOCK_D=block_dl, **pdl_args(q.device),
        )  # fmt: skip
    return out


def mla_decode_ref(
    q: torch.Tensor,
    kv_pool: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    sm_scale: float,
    *,
    kv_lora_rank: int = 512,
    kv_scale: torch.Tensor | None = None,
    max_seq_len: int | None = None,
) -> torch.Tensor:
    """Torch reference of `mla_decode`, in float32 (or q's wider dtype); returns `[B, H, Dl]`.

    q `[B, H, Dl + Dr]`, kv_pool `[num_slots, 1, Dl + Dr]`, the CSR page table and seq_lens as
    `decode_attention`; Dl = kv_lora_rank. One padded SDPA call with the H heads in the query
    length (padding reads slot 0 and is masked; an empty sequence gives zeros). `max_seq_len`
    (a host int) sizes the padding; None reads seq_lens.max(), a host sync.
    """
    B, H, D = q.shape
    Dl = kv_lora_rank
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max()) if B else 0
    if max_seq_len == 0:
        return q.new_zeros(B, H, Dl)
    cols = torch.arange(max_seq_len, device=q.device)  # [L]
    valid = cols[None, :] < seq_lens[:, None]  # [B, L]
    entries = kv_indptr[:-1, None].long() + cols[None, :] // page_size  # [B, L] into kv_indices
    entries = torch.where(valid, entries, 0)  # padding reads entry 0 (in range)
    slots = kv_indices[entries].long() * page_size + cols[None, :] % page_size  # [B, L]
    slots = torch.where(valid, slots, 0)
    acc = torch.promote_types(q.dtype, torch.float32)
    scale = None if kv_scale is None else kv_scale[slots, 0]  # [B, L]
    rows = dequantize_ref(kv_pool[slots, 0], scale).to(acc)[:, None]  # [B, 1, L, Dl + Dr]
    out = F.scaled_dot_product_attention(
        q.to(acc)[:, None], rows, rows[..., :Dl], attn_mask=valid[:, None, None, :], scale=sm_scale
    )  # [B, 1, H, Dl]
    out = torch.where(seq_lens[:, None, None, None] > 0, out, 0.0)  # all-masked rows are NaN
    return out[:, 0].to(q.dtype)
