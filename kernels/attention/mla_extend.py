"""Multi-head latent attention (MLA) extend (prefill with a cached prefix), absorbed form.

Sequence i has `prefix_lens[i]` latent rows in the pool (read through the page table) and
`qo_indptr[i+1] - qo_indptr[i]` new tokens whose queries sit in `q` and whose latent rows sit in
`kv_new`; the new rows are read from `kv_new`, so the caller may store them into the pool before
or after this call. Every head of a new token attends to the whole prefix and causally to the
new tokens, over the same latent rows (MQA): scores over all Dl + Dr columns, V = the first Dl.
An fp8 or int8 pool (one float32 scale per row) only changes how the prefix is read.

The kernel flattens each sequence's (new token, head) pairs into query rows, row = token * H +
head, and one program takes BLOCK_M of them: since every head shares the latent rows, one tile
load serves all heads of the block, and a short extend (one token, H heads) still fills it.
FlashAttention-style online softmax over the prefix tiles, then over the new tiles up to the
block's last token, masked per row.
"""

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels.attention.decode import LOG2E
from kernels.attention.extend_tiles import extend_range
from kernels.attention.mla_decode import check_latent
from kernels.attention.mla_tiles import latent_softmax_step, load_latent, paged_latent_tile
from kernels.kv.paging import check_page_table, extend_runs
from kernels.kv.store import QUANT_MAX, dequantize_ref


@triton.jit(do_not_specialize=["heads"])
def _mla_extend_kernel(
    q_ptr, kv_new_ptr, kv_ptr,
    kv_scale_ptr,  # [num_slots] float32, read only when QUANT
    o_ptr,  # [T, heads, DL] contiguous
    qo_indptr_ptr, prefix_lens_ptr, kv_indptr_ptr, kv_indices_ptr,
    qk_scale,  # sm_scale * log2(e)
    stride_qt, stride_qh, stride_newt, stride_kvs, heads,
    DL: tl.constexpr, DR: tl.constexpr, PAGE_SIZE: tl.constexpr, QUANT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DL: tl.constexpr, BLOCK_DR: tl.constexpr,
):  # fmt: skip
    mb = tl.program_id(0)  # row blocks first: grid dim 0 has no 65535 limit
    b = tl.program_id(1)

    q_start, new_len, _, prefix_len, new_end, page_base = extend_range(
        qo_indptr_ptr, prefix_lens_ptr, kv_indptr_ptr, b, mb, heads, BLOCK_M)

    offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)  # query rows, token * heads + head
    tok = offs_m // heads  # [BLOCK_M] new-token index within the sequence
    head = offs_m % heads
    mask_m = tok < new_len
    offs_l = tl.arange(0, BLOCK_DL)
    mask_l = offs_l < DL
    offs_r = tl.arange(0, BLOCK_DR)
    mask_r = offs_r < DR
    q_rows = q_ptr + (q_start + tok).to(tl.int64)[:, None] * stride_qt + head[:, None] * stride_qh
    q_nope, q_rope = load_latent(q_rows, mask_m, offs_l, mask_l, offs_r, mask_r, DL)

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DL], tl.float32)

    for n0 in range(0, prefix_len, BLOCK_N):  # cached prefix, through the page table
        m, l_sum, acc = paged_latent_tile(
            q_nope, q_rope, m, l_sum, acc, n0, prefix_len, kv_indices_ptr, page_base, kv_ptr,
            kv_scale_ptr, stride_kvs, offs_l, mask_l, offs_r, mask_r, qk_scale, DL, PAGE_SIZE,
            QUANT, BLOCK_N,
        )  # fmt: skip

    for n0 in range(0, new_end, BLOCK_N):  # new tokens, causal per row
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < new_len
        rows = kv_new_ptr + (q_start + offs_n).to(tl.int64)[:, None] * stride_newt
        c_kv, k_rope = load_latent(rows, mask_n, offs_l, mask_l, offs_r, mask_r, DL)
        causal = (offs_n[None, :] <= tok[:, None]) & mask_n[None, :]  # [BLOCK_M, BLOCK_N]
        m, l_sum, acc = latent_softmax_step(
            q_nope, q_rope, c_kv, k_rope, offs_n, causal, m, l_sum, acc, qk_scale, False
        )

    o = acc / tl.where(l_sum > 0, l_sum, 1.0)[:, None]  # [BLOCK_M, BLOCK_DL]
    o_rows = ((q_start + tok).to(tl.int64) * heads + head) * DL  # [BLOCK_M]
    mask_ml = mask_m[:, None] & mask_l[None, :]
    tl.store(o_ptr + o_rows[:, None] + offs_l[None, :], o.to(o_ptr.dtype.element_ty), mask_ml)


def mla_extend(
    q: torch.Tensor, kv_new: torch.Tensor, kv_pool: torch.Tensor, qo_indptr: torch.Tensor,
    prefix_lens: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor, page_size: int,
    sm_scale: float, *, kv_lora_rank: int = 512, kv_scale: torch.Tensor | None = None,
    max_new_len: int | None = None,
) -> torch.Tensor:  # fmt: skip
    """MLA attention of a varlen batch's new tokens over prefix + themselves, absorbed form;
    returns o `[T, H, Dl]` in q's dtype (before W_UV).

    q `[T, H, Dl + Dr]` (q_nope @ W_UK, then q_rope) and kv_new `[T, 1, Dl + Dr]` (the new
    tokens' latent rows) may be strided views, contiguous in the last dim; Dl = kv_lora_rank.
    Sequence i's rows are `qo_indptr[i]:qo_indptr[i+1]` (int32 `[B+1]`); its `prefix_lens[i]`
    (int32 `[B]`) cached rows are read from kv_pool `[num_slots, 1, Dl + Dr]` (q's dtype)
    through the CSR page table kv_indptr `[B+1]` int32 / kv_indices int32/int64 page ids.
    A float8_e4m3fn or int8 pool needs kv_scale `[num_slots, 1]` float32 (contiguous).
    max_new_len (the longest run of new tokens) sizes the grid; None reads it from qo_indptr,
    a host sync.
    """
    Dl, Dr, kv_scale = check_latent(q, kv_pool, kv_scale, kv_lora_rank)
    T, H, D = q.shape
    assert kv_new.shape == (T, 1, D), f"kv_new {tuple(kv_new.shape)} must be [{T}, 1, {D}]"
    assert kv_new.dtype == q.dtype, f"kv_new dtype {kv_new.dtype} != q dtype {q.dtype}"
    assert kv_new.stride(-1) == 1, "kv_new must be contiguous in its last dim"
    B = prefix_lens.shape[0]
    check_page_table(kv_indices, page_size, qo_indptr=(qo_indptr, B + 1),
                     prefix_lens=(prefix_lens, B), kv_indptr=(kv_indptr, B + 1))
    o = torch.empty(T, H, Dl, dtype=q.dtype, device=q.device)
    if T == 0 or B == 0:
        return o
    if max_new_len is None:
        max_new_len = int((qo_indptr[1:] - qo_indptr[:-1]).max())
    # a [BLOCK_M, Dl] float32 accumulator: 32 x 512 over 8 warps is 64 registers a thread
    block_m, block_n, warps = (32, 32, 8) if Dl > 128 else (64, 32, 4)
    qo_indptr, prefix_lens, kv_indptr, kv_indices = (
        t.contiguous() for t in (qo_indptr, prefix_lens, kv_indptr, kv_indices)
    )
    _mla_extend_kernel[(triton.cdiv(max_new_len * H, block_m), B)](
        q, kv_new, kv_pool, kv_scale, o, qo_indptr, prefix_lens, kv_indptr, kv_indices,
        sm_scale * LOG2E, q.stride(0), q.stride(1), kv_new.stride(0), kv_pool.stride(0),
        heads=H, DL=Dl, DR=Dr, PAGE_SIZE=page_size, QUANT=kv_pool.dtype in QUANT_MAX,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_DL=max(16, triton.next_power_of_2(Dl)),
        BLOCK_DR=max(16, triton.next_power_of_2(Dr)),
        num_warps=warps, num_stages=2,
    )  # fmt: skip
    return o


def mla_extend_ref(
    q: torch.Tensor, kv_new: torch.Tensor, kv_pool: torch.Tensor, qo_indptr: torch.Tensor,
    prefix_lens: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor, page_size: int,
    sm_scale: float, *, kv_lora_rank: int = 512, kv_scale: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """Torch reference of `mla_extend`, in float32 (or q's wider dtype); returns `[T, H, Dl]`.

    One SDPA call per sequence with its n new tokens' H heads in the query length (n * H rows)
    over its prefix rows (gathered through the page table) and its new rows. Reads the lengths
    on the host, a sync on a GPU.
    """
    T, H, D = q.shape
    Dl = kv_lora_rank
    acc = torch.promote_types(q.dtype, torch.float32)
    out = torch.zeros(T, H, Dl, dtype=acc, device=q.device)
    for lo, hi, slots in extend_runs(qo_indptr, prefix_lens, kv_indptr, kv_indices, page_size):
        n, prefix = hi - lo, len(slots)  # slots [P] of the cached prefix
        scale = None if kv_scale is None else kv_scale[slots, 0]  # [P]
        prefix_rows = dequantize_ref(kv_pool[slots, 0], scale).to(acc)  # [P, Dl + Dr]
        rows = torch.cat([prefix_rows, kv_new[lo:hi, 0].to(acc)])  # [P+n, Dl + Dr]
        qi = q[lo:hi].to(acc).reshape(1, 1, n * H, D)  # [1, 1, n*H, D], row = token * H + head
        tok = torch.arange(n * H, device=q.device)[:, None] // H  # [n*H, 1]
        cols = torch.arange(prefix + n, device=q.device)[None, :]  # [1, P+n]
        oi = F.scaled_dot_product_attention(
            qi, rows[None, None], rows[None, None, :, :Dl], attn_mask=cols <= tok + prefix,
            scale=sm_scale,
        )  # [1, 1, n*H, Dl]
        out[lo:hi] = oi.reshape(n, H, Dl)
    return out.to(q.dtype)
