"""RoPE fused with the KV store: one launch rotates q and k and writes k, v into the pool.

Per token it reads q, k, v straight from the fused QKV projection (any token and head
strides), optionally RMS-normalizes each q/k head over head_dim first (Qwen3's q/k norm),
rotates q and k at the token's position (NeoX halves, as `kernels/norm_rope/rope.py`), writes the
rotated q to a new contiguous tensor and the rotated k plus v into the pool row `slots[t]`
(quantized per (slot, head) for an fp8/int8 pool, as `kernels/kv/store.py`). An extend also
needs the new tokens' K/V as plain tensors (its attention reads them unquantized): `kv_out`
writes them, contiguous. Every intermediate is rounded to the model dtype where the unfused
ops (`rmsnorm`, `apply_rope`, `store_kv`) round it, so the pool and q match theirs.

Slot addressing is the same for the token, paged and contiguous layouts (a page table maps a
position to a slot before this runs), so one kernel serves all three.
"""

import torch
import triton
import triton.language as tl

from kernels.kv.store import pool_store_args, store_kv_ref, store_pool_row
from kernels.norm_rope.rmsnorm import rmsnorm_ref
from kernels.norm_rope.rope import apply_rope_ref, cos_sin_row
from kernels.pdl import pdl_args, pdl_wait


@triton.jit
def _norm_rotate(
    row_ptr, stride_h, norm_w_ptr, eps, cos, sin,
    HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, NORM: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):  # fmt: skip
    """One token's heads `[BLOCK_H, BLOCK_D]` normed (if NORM) and rotated, fp32 values rounded
    to the input dtype. cos/sin `[1, BLOCK_D]` are the position's table row repeated per half."""
    half = HEAD_DIM // 2
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    # rotate_half partner of lane d: x[d + D/2] negated in the first half, x[d - D/2] after
    partner_d = tl.where(offs_d < half, offs_d + half, offs_d - half)  # [BLOCK_D]
    sign = tl.where(offs_d < half, -1.0, 1.0)[None, :]  # [1, BLOCK_D]
    mask = (offs_h[:, None] < HEADS) & (offs_d[None, :] < HEAD_DIM)  # [BLOCK_H, BLOCK_D]
    rows = row_ptr + offs_h[:, None] * stride_h
    dtype = row_ptr.dtype.element_ty
    x = tl.load(rows + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
    p = tl.load(rows + partner_d[None, :], mask=mask, other=0.0).to(tl.float32)
    if NORM:
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, 1) / HEAD_DIM + eps)  # [BLOCK_H]
        mask_d = offs_d < HEAD_DIM
        w = tl.load(norm_w_ptr + offs_d, mask=mask_d, other=0.0).to(tl.float32)
        w_p = tl.load(norm_w_ptr + partner_d, mask=mask_d, other=0.0).to(tl.float32)
        x = (x * rstd[:, None] * w[None, :]).to(dtype).to(tl.float32)
        p = (p * rstd[:, None] * w_p[None, :]).to(dtype).to(tl.float32)
    return (x * cos + sign * p * sin).to(dtype).to(tl.float32)  # [BLOCK_H, BLOCK_D]


@triton.jit
def _rope_store_kv_kernel(
    q_ptr, k_ptr, v_ptr,
    q_out_ptr,  # [T, Q_HEADS, HEAD_DIM] contiguous
    k_out_ptr,  # [T, KV_HEADS, HEAD_DIM] contiguous, written only when KV_OUT
    v_out_ptr, k_buf_ptr, v_buf_ptr,
    k_scale_ptr,  # [num_slots, KV_HEADS], written only when QUANT
    v_scale_ptr,
    q_norm_ptr,  # [HEAD_DIM], read only when NORM
    k_norm_ptr, eps, positions_ptr, slots_ptr,
    cache_ptr,  # [max_pos, HEAD_DIM]: cos | sin
    stride_qt, stride_qh,
    stride_kt,  # k and v share strides
    stride_kh,
    stride_bs,  # k_buf and v_buf share strides
    stride_bh,
    stride_ss,  # k_scale and v_scale share strides
    stride_sh, stride_c,
    Q_HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, NORM: tl.constexpr,
    KV_OUT: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_D: tl.constexpr,
    QUANT: tl.constexpr, IS_INT: tl.constexpr, QMAX: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0)
    # before the PDL wait: the step's positions and slots (staged before its first kernel) and
    # the table's row; q, k, v after it
    pos = tl.load(positions_ptr + t).to(tl.int64)
    slot = tl.load(slots_ptr + t).to(tl.int64)
    half = HEAD_DIM // 2
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    freq = tl.where(offs_d < half, offs_d, offs_d - half)  # [BLOCK_D]: the table column
    cos, sin = cos_sin_row(cache_ptr, pos, stride_c, freq, mask_d, half)  # [1, BLOCK_D] each
    pdl_wait(PDL)

    q = _norm_rotate(q_ptr + t * stride_qt, stride_qh, q_norm_ptr, eps, cos, sin,
                     Q_HEADS, HEAD_DIM, NORM, BLOCK_HQ, BLOCK_D)  # [BLOCK_HQ, BLOCK_D]
    offs_hq = tl.arange(0, BLOCK_HQ)
    mask_q = (offs_hq[:, None] < Q_HEADS) & mask_d[None, :]
    q_dst = q_out_ptr + (t * Q_HEADS + offs_hq[:, None]) * HEAD_DIM + offs_d[None, :]
    tl.store(q_dst, q.to(q_out_ptr.dtype.element_ty), mask=mask_q)

    k = _norm_rotate(k_ptr + t * stride_kt, stride_kh, k_norm_ptr, eps, cos, sin,
                     KV_HEADS, HEAD_DIM, NORM, BLOCK_HK, BLOCK_D)  # [BLOCK_HK, BLOCK_D]
    offs_h = tl.arange(0, BLOCK_HK)
    mask_h = offs_h < KV_HEADS
    mask = mask_h[:, None] & mask_d[None, :]  # [BLOCK_HK, BLOCK_D]
    v = tl.load(v_ptr + t * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :],
                mask=mask, other=0.0).to(tl.float32)  # [BLOCK_HK, BLOCK_D]
    if KV_OUT:
        new = (t * KV_HEADS + offs_h[:, None]) * HEAD_DIM + offs_d[None, :]
        tl.store(k_out_ptr + new, k.to(k_out_ptr.dtype.element_ty), mask=mask)
        tl.store(v_out_ptr + new, v.to(v_out_ptr.dtype.element_ty), mask=mask)
    store_pool_row(k, v, k_buf_ptr, v_buf_ptr, k_scale_ptr, v_scale_ptr, slot, offs_h, offs_d,
                   mask, mask_h, stride_bs, stride_bh, stride_ss, stride_sh, QUANT, IS_INT, QMAX)


def rope_store_kv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
    slots: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor, *,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
    q_norm: torch.Tensor | None = None, k_norm: torch.Tensor | None = None, eps: float = 1e-6,
    kv_out: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:  # fmt: skip
    """Rotate q `[T, Hq, D]` and k `[T, Hkv, D]` at `positions [T]`, store rotated k and v
    `[T, Hkv, D]` into `k_buf`/`v_buf` `[num_slots, Hkv, D]` at `slots [T]`; returns
    (rotated q, contiguous; rotated k and v, contiguous, when `kv_out`, else None twice).

    q, k, v may be strided views (k and v with the same strides), contiguous along D.
    `q_norm`/`k_norm` `[D]` (both or neither) RMS-normalize each head with `eps` before the
    rotation. A float8_e4m3fn or int8 pool needs `k_scale`/`v_scale` `[num_slots, Hkv]`
    float32, as `store_kv`. cos_sin_cache `[max_pos, D]` from `rope_cos_sin_cache`.
    """
    assert q.dim() == 3 and k.dim() == 3 and k.shape == v.shape, (
        f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} must be [T, H, D]"
    )
    T, Hq, D = q.shape
    Hkv = k.shape[1]
    assert k.shape[0] == T and k.shape[2] == D, f"k {tuple(k.shape)} must be [{T}, Hkv, {D}]"
    assert D % 2 == 0, f"head_dim {D} must be even"
    assert q.dtype == k.dtype == v.dtype, f"q {q.dtype}, k {k.dtype}, v {v.dtype} differ"
    assert k.stride() == v.stride(), "k and v must share strides"
    for name, x in (("q", q), ("k", k), ("cos_sin_cache", cos_sin_cache)):
        assert x.stride(-1) == 1, f"{name} must be contiguous along its last dim"
    for name, idx in (("slots", slots), ("positions", positions)):
        assert idx.shape == (T,) and idx.dtype in (torch.int32, torch.int64), (
            f"{name} must be int32/int64 [{T}], got {idx.dtype} {tuple(idx.shape)}"
        )
    assert cos_sin_cache.dim() == 2 and cos_sin_cache.shape[1] == D, (
        f"cos_sin_cache {tuple(cos_sin_cache.shape)} must be [max_pos, {D}]"
    )
    norm = q_norm is not None
    assert (k_norm is not None) == norm, "q_norm and k_norm go together"
    if norm:
        assert q_norm.shape == (D,) and k_norm.shape == (D,), f"q/k norm weights must be [{D}]"
        assert q_norm.is_contiguous() and k_norm.is_contiguous(), "norm weights: contiguous"
    pool = pool_store_args(k_buf, v_buf, k_scale, v_scale, Hkv, D)
    q_out = torch.empty(T, Hq, D, dtype=q.dtype, device=q.device)
    k_out = torch.empty(T, Hkv, D, dtype=k.dtype, device=k.device) if kv_out else None
    v_out = torch.empty_like(k_out) if kv_out else None
    if T > 0:
        block_hq, block_d = triton.next_power_of_2(Hq), triton.next_power_of_2(D)
        _rope_store_kv_kernel[(T,)](
            q, k, v, q_out, k_out if kv_out else q_out, v_out if kv_out else q_out,
            q_norm_ptr=q_norm if norm else q, k_norm_ptr=k_norm if norm else q, eps=eps,
            positions_ptr=positions.contiguous(), slots_ptr=slots.contiguous(),
            cache_ptr=cos_sin_cache, stride_qt=q.stride(0), stride_qh=q.stride(1),
            stride_kt=k.stride(0), stride_kh=k.stride(1), stride_c=cos_sin_cache.stride(0),
            Q_HEADS=Hq, KV_HEADS=Hkv, HEAD_DIM=D, NORM=norm, KV_OUT=kv_out,
            BLOCK_HQ=block_hq, BLOCK_HK=triton.next_power_of_2(Hkv), BLOCK_D=block_d,
            num_warps=8 if block_hq * block_d >= 4096 else 4,  # q tile and its partner in fp32
            **pool, **pdl_args(q.device),
        )  # fmt: skip
    return q_out, k_out, v_out


def rope_store_kv_ref(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
    slots: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor, *,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
    q_norm: torch.Tensor | None = None, k_norm: torch.Tensor | None = None, eps: float = 1e-6,
    kv_out: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:  # fmt: skip
    """Torch reference of `rope_store_kv` (same contract): the unfused references in turn."""
    if q_norm is not None:
        q, k = rmsnorm_ref(q, q_norm, eps), rmsnorm_ref(k, k_norm, eps)  # [T, H, D] each
    q, k = apply_rope_ref(q, k, positions, cos_sin_cache)
    store_kv_ref(k, v, k_buf, v_buf, slots, k_scale=k_scale, v_scale=v_scale)
    return q.contiguous(), (k.contiguous() if kv_out else None), (
        v.contiguous() if kv_out else None
    )
