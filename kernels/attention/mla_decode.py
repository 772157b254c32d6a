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

from kernels.attention.decode import LOG2E, decode_num_splits, merge_splits, output_buffer
from kernels.attention.decode_config import LaunchConfig
from kernels.attention.decode_parts import split_range, store_split
from kernels.attention.mla_tiles import load_latent, paged_latent_tile
from kernels.kv.paging import check_page_table, padded_slots
from kernels.kv.store import QUANT_MAX, dequantize_ref


@dataclass(frozen=True)
class MlaDecodeConfig(LaunchConfig):
    """Launch knobs of the stage-1 kernel (bench/kernels/mla.py --sweep searches them).

    The default is the one whose sm_90 build keeps its [block_h, Dl] float32 accumulator and
    both dot operands in registers without spilling (160 registers a thread for a 16-bit pool,
    238 for fp8, at Dl 512); 4 warps needs 249 (and spills with fp8), 64 heads a block spills.
    """

    TILES = ("block_h", "block_n")
    block_h: int = 16
    block_n: int = 32
    num_warps: int = 8
    num_stages: int = 2


@triton.jit(do_not_specialize=["num_splits", "heads"])  # one compile for any split count
def _mla_decode_kernel(
    q_ptr, kv_ptr,
    kv_scale_ptr,  # [num_slots] float32, read only when QUANT
    kv_indptr_ptr, kv_indices_ptr, seq_lens_ptr,
    o_ptr,  # [B, heads, num_splits, DL] float32 partials, or [B, heads, DL] when DIRECT
    lse_ptr,  # [B, heads, num_splits] float32, unused when DIRECT
    qk_scale,  # sm_scale * log2(e): the softmax runs in base 2
    num_splits, stride_qb, stride_qh, stride_kvs, heads,
    DL: tl.constexpr, DR: tl.constexpr, PAGE_SIZE: tl.constexpr, QUANT: tl.constexpr,
    DIRECT: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DL: tl.constexpr,
    BLOCK_DR: tl.constexpr,
):  # fmt: skip
    b, hg, split, start, end, page_base = split_range(seq_lens_ptr, kv_indptr_ptr, num_splits,
                                                      BLOCK_N)
    offs_h = hg * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < heads
    offs_l = tl.arange(0, BLOCK_DL)
    mask_l = offs_l < DL
    offs_r = tl.arange(0, BLOCK_DR)
    mask_r = offs_r < DR
    q_rows = q_ptr + b * stride_qb + offs_h[:, None] * stride_qh
    q_nope, q_rope = load_latent(q_rows, mask_h, offs_l, mask_l, offs_r, mask_r, DL)

    m = tl.full([BLOCK_H], float("-inf"), tl.float32)  # running max (base-2 logits)
    l_sum = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DL], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        m, l_sum, acc = paged_latent_tile(
            q_nope, q_rope, m, l_sum, acc, n0, end, kv_indices_ptr, page_base, kv_ptr,
            kv_scale_ptr, stride_kvs, offs_l, mask_l, offs_r, mask_r, qk_scale, DL, PAGE_SIZE,
            QUANT, BLOCK_N,
        )  # fmt: skip

    if DIRECT:  # o_ptr is the output: one split, no log-sum-exp, no merge
        store_split(acc, m, l_sum, o_ptr, lse_ptr, b, heads, offs_h, 0, 1, offs_l, mask_h, mask_l,
                    DL, False)
    else:
        store_split(acc, m, l_sum, o_ptr, lse_ptr, b, heads, offs_h, split, num_splits, offs_l,
                    mask_h, mask_l, DL, True)


def check_latent(q: torch.Tensor, kv_pool: torch.Tensor, kv_scale: torch.Tensor | None,
                 kv_lora_rank: int) -> tuple[int, int, torch.Tensor]:
    """Check absorbed queries q `[N, H, Dl + Dr]` against a latent pool `[num_slots, 1, Dl +
    Dr]` (Dl = kv_lora_rank) of q's dtype, or 8-bit with kv_scale `[num_slots, 1]` float32
    (contiguous), both contiguous in the last dim. Returns (Dl, Dr, the scale tensor the
    kernel reads: a placeholder for a 16-bit pool)."""
    assert q.dim() == 3, f"q must be [N, H, Dl + Dr], got {tuple(q.shape)}"
    D = q.shape[2]
    Dl, Dr = kv_lora_rank, D - kv_lora_rank
    assert Dr > 0, f"q width {D} must exceed kv_lora_rank {Dl} (the rope part)"
    assert kv_pool.dim() == 3 and kv_pool.shape[1:] == (1, D), (
        f"kv_pool {tuple(kv_pool.shape)} must be [num_slots, 1, {D}]"
    )
    assert q.stride(-1) == 1 and kv_pool.stride(-1) == 1, "q, kv_pool must be contiguous in D"
    if kv_pool.dtype not in QUANT_MAX:
        assert kv_pool.dtype == q.dtype, f"pool dtype {kv_pool.dtype} != q dtype {q.dtype}"
        return Dl, Dr, kv_pool  # unused: QUANT is off
    assert kv_scale is not None and kv_scale.shape == (kv_pool.shape[0], 1), (
        f"a {kv_pool.dtype} pool needs kv_scale float32 [{kv_pool.shape[0]}, 1]"
    )
    assert kv_scale.dtype == torch.float32 and kv_scale.is_contiguous(), (
        "kv_scale must be contiguous float32"
    )
    return Dl, Dr, kv_scale


def mla_decode_num_splits(batch: int, heads: int, max_seq_len: int, block_h: int = 16) -> int:
    """Splits per sequence for `mla_decode`: `decode_num_splits` over the head groups.

    Exposed so a CUDA-graph caller can fix the split count from host-side lengths.
    """
    return decode_num_splits(batch, triton.cdiv(heads, block_h), max_seq_len)


def mla_decode(
    q: torch.Tensor, kv_pool: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
    seq_lens: torch.Tensor, page_size: int, sm_scale: float, *, kv_lora_rank: int = 512,
    kv_scale: torch.Tensor | None = None, num_splits: int | None = None,
    out: torch.Tensor | None = None, config: MlaDecodeConfig | None = None,
) -> torch.Tensor:  # fmt: skip
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
    Dl, Dr, kv_scale = check_latent(q, kv_pool, kv_scale, kv_lora_rank)
    B, H, _ = q.shape
    check_page_table(kv_indices, page_size, kv_indptr=(kv_indptr, B + 1), seq_lens=(seq_lens, B))
    out = output_buffer(out, (B, H, Dl), q)
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
        merge_splits(dst, lse, out, block_dl)
    return out


def mla_decode_ref(
    q: torch.Tensor, kv_pool: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
    seq_lens: torch.Tensor, page_size: int, sm_scale: float, *, kv_lora_rank: int = 512,
    kv_scale: torch.Tensor | None = None, max_seq_len: int | None = None,
) -> torch.Tensor:  # fmt: skip
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
    slots, valid = padded_slots(kv_indptr, kv_indices, seq_lens, page_size, max_seq_len)  # [B, L]
    acc = torch.promote_types(q.dtype, torch.float32)
    scale = None if kv_scale is None else kv_scale[slots, 0]  # [B, L]
    rows = dequantize_ref(kv_pool[slots, 0], scale).to(acc)[:, None]  # [B, 1, L, Dl + Dr]
    out = F.scaled_dot_product_attention(
        q.to(acc)[:, None], rows, rows[..., :Dl], attn_mask=valid[:, None, None, :], scale=sm_scale
    )  # [B, 1, H, Dl]
    out = torch.where(seq_lens[:, None, None, None] > 0, out, 0.0)  # all-masked rows are NaN
    return out[:, 0].to(q.dtype)
