"""Scatter new K/V rows into the KV pool, quantizing to fp8 (e4m3) or int8 on the way.

Quantized pools keep one float32 scale per (slot, kv_head): `x ~= q * scale` with
`scale = amax(|x|) / qmax` over head_dim (qmax 448 for e4m3, 127 for int8; 1.0 for an all-zero
row). int8 rounds half up, `floor(x / scale + 0.5)`. An fp8 pool without scales (per-tensor
scale 1) stores `x` itself, clamped to +-448.
"""

import torch
import triton
import triton.language as tl

QUANT_MAX = {torch.float8_e4m3fn: 448.0, torch.int8: 127.0}


@triton.jit
def _quantize_store(
    x,
    dst_ptrs,
    scale_ptrs,
    mask,
    mask_h,
    QUANT: tl.constexpr,
    IS_INT: tl.constexpr,
    QMAX: tl.constexpr,
):
    """Store one [BLOCK_H, BLOCK_D] tile `x` (fp32), quantized per row when QUANT, else cast
    (clamped to +-QMAX where QMAX > 0: an unscaled fp8 pool's 448; a 16-bit pool's is 0)."""
    if QUANT:
        amax = tl.max(tl.abs(x), 1)  # [BLOCK_H]
        scale = tl.where(amax > 0, amax / QMAX, 1.0)  # [BLOCK_H]
        y = x / scale[:, None]
        if IS_INT:
            y = tl.floor(y + 0.5)
        y = tl.minimum(tl.maximum(y, -QMAX), QMAX)
        tl.store(dst_ptrs, y.to(dst_ptrs.dtype.element_ty), mask=mask)
        tl.store(scale_ptrs, scale, mask=mask_h)
    else:
        if QMAX > 0:
            x = tl.minimum(tl.maximum(x, -QMAX), QMAX)
        tl.store(dst_ptrs, x.to(dst_ptrs.dtype.element_ty), mask=mask)


@triton.jit
def store_pool_row(
    k, v, k_buf_ptr, v_buf_ptr, k_scale_ptr, v_scale_ptr, slot, offs_h, offs_d, mask, mask_h,
    stride_bs, stride_bh, stride_ss, stride_sh,
    QUANT: tl.constexpr, IS_INT: tl.constexpr, QMAX: tl.constexpr,
):  # fmt: skip
    """One token's k and v `[BLOCK_H, BLOCK_D]` (fp32, heads offs_h) into pool row `slot`
    (int64) of k_buf / v_buf, through `_quantize_store` (per-head scales at k_scale / v_scale
    when QUANT)."""
    dst = slot * stride_bs + offs_h[:, None] * stride_bh + offs_d[None, :]
    scale_offs = slot * stride_ss + offs_h * stride_sh  # [BLOCK_H]
    _quantize_store(k, k_buf_ptr + dst, k_scale_ptr + scale_offs, mask, mask_h, QUANT, IS_INT, QMAX)
    _quantize_store(v, v_buf_ptr + dst, v_scale_ptr + scale_offs, mask, mask_h, QUANT, IS_INT, QMAX)


@triton.jit
def _store_kv_kernel(
    k_ptr, v_ptr, k_buf_ptr, v_buf_ptr,
    k_scale_ptr,  # [num_slots, KV_HEADS], written only when QUANT
    v_scale_ptr, slots_ptr,
    stride_t,  # k and v share strides
    stride_h,
    stride_bs,  # k_buf and v_buf share strides
    stride_bh,
    stride_ss,  # k_scale and v_scale share strides
    stride_sh,
    KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    QUANT: tl.constexpr, IS_INT: tl.constexpr, QMAX: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0)
    slot = tl.load(slots_ptr + t).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask_h = offs_h < KV_HEADS
    mask = mask_h[:, None] & (offs_d[None, :] < HEAD_DIM)  # [BLOCK_H, BLOCK_D]
    src = t * stride_t + offs_h[:, None] * stride_h + offs_d[None, :]
    k = tl.load(k_ptr + src, mask=mask, other=0.0).to(tl.float32)  # [BLOCK_H, BLOCK_D]
    v = tl.load(v_ptr + src, mask=mask, other=0.0).to(tl.float32)  # [BLOCK_H, BLOCK_D]
    store_pool_row(k, v, k_buf_ptr, v_buf_ptr, k_scale_ptr, v_scale_ptr, slot, offs_h, offs_d,
                   mask, mask_h, stride_bs, stride_bh, stride_ss, stride_sh, QUANT, IS_INT, QMAX)


def store_kv(
    k: torch.Tensor, v: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, slots: torch.Tensor,
    *, k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
) -> None:  # fmt: skip
    """Write `k`, `v` `[T, kv_heads, head_dim]` into `k_buf`, `v_buf` `[num_slots, kv_heads,
    head_dim]` at rows `slots [T]` (int32/int64), in place.

    For an int8 pool, `k_scale`/`v_scale` `[num_slots, kv_heads]` float32 are required and
    receive the per-(slot, head) scales (`scale_strides`); a float8_e4m3fn pool takes them
    or, without, stores unscaled codes (clamped to +-448). Other pool dtypes get a plain cast.
    """
    assert k.dim() == 3 and k.shape == v.shape, (
        f"k {tuple(k.shape)} and v {tuple(v.shape)} must both be [T, H, D]"
    )
    T, H, D = k.shape
    assert slots.shape == (T,), f"slots {tuple(slots.shape)} must be [{T}]"
    assert slots.dtype in (torch.int32, torch.int64), f"slots dtype {slots.dtype} must be int32/64"
    assert k.stride() == v.stride(), "k and v must share strides"
    assert k.stride(-1) == 1, "k must be contiguous in head_dim"
    pool = pool_store_args(k_buf, v_buf, k_scale, v_scale, H, D)
    if T == 0:
        return
    _store_kv_kernel[(T,)](
        k, v, slots_ptr=slots.contiguous(), stride_t=k.stride(0), stride_h=k.stride(1),
        KV_HEADS=H, HEAD_DIM=D, BLOCK_H=triton.next_power_of_2(H),
        BLOCK_D=triton.next_power_of_2(D), **pool,
    )  # fmt: skip


def pool_store_args(k_buf: torch.Tensor, v_buf: torch.Tensor, k_scale: torch.Tensor | None,
                    v_scale: torch.Tensor | None, heads: int, head_dim: int) -> dict:
    """Check a K/V pool `[num_slots, heads, head_dim]` (k_buf and v_buf alike, contiguous in
    head_dim) and its scales as `store_kv` takes them; returns the keyword arguments of a
    kernel that writes it with `store_pool_row`: the pool, its scales (placeholders when none
    is written) and their strides, QUANT, IS_INT and QMAX."""
    assert k_buf.dim() == 3 and k_buf.shape[1:] == (heads, head_dim), (
        f"k_buf {tuple(k_buf.shape)} must be [num_slots, {heads}, {head_dim}]"
    )
    assert v_buf.shape == k_buf.shape, f"v_buf {tuple(v_buf.shape)} != k_buf {tuple(k_buf.shape)}"
    assert k_buf.dtype == v_buf.dtype, f"k_buf {k_buf.dtype} and v_buf {v_buf.dtype} differ"
    assert k_buf.stride() == v_buf.stride(), "k_buf and v_buf must share strides"
    assert k_buf.stride(-1) == 1, "k_buf must be contiguous in head_dim"
    quant = k_buf.dtype in QUANT_MAX and not unscaled_pool(k_buf, k_scale, v_scale)
    if quant:
        stride_ss, stride_sh = scale_strides(k_buf, k_scale, v_scale)
    else:
        k_scale = v_scale = k_buf  # unused placeholders: QUANT is off
        stride_ss = stride_sh = 0
    return dict(
        k_buf_ptr=k_buf, v_buf_ptr=v_buf, k_scale_ptr=k_scale, v_scale_ptr=v_scale,
        stride_bs=k_buf.stride(0), stride_bh=k_buf.stride(1), stride_ss=stride_ss,
        stride_sh=stride_sh, QUANT=quant, IS_INT=k_buf.dtype == torch.int8,
        QMAX=QUANT_MAX.get(k_buf.dtype, 0.0),
    )


def scale_pairs(num_slots: int, kv_heads: int, device: torch.device | str) -> torch.Tensor:
    """A K/V pool's scales, all ones: `[num_slots, kv_heads, 2]` float32, whose `[..., 0]` and
    `[..., 1]` are its k_scale and v_scale, a (slot, head)'s two side by side. Decode reads
    both with one 8-byte load a key; as two tensors, in the token layout (a warp's keys on as
    many lines), their loads were 40% of its line requests, and it ran at 67-75% of the copy
    ceiling against 81-86% now (bench/results/kernels/2026-12-03-decode-scale-pairs-h200.md)."""
    return torch.ones(num_slots, kv_heads, 2, dtype=torch.float32, device=device)


def scale_strides(buf: torch.Tensor, k_scale: torch.Tensor | None,
                  v_scale: torch.Tensor | None) -> tuple[int, int]:
    """Check a scaled pool's `k_scale`, `v_scale`: float32 `[num_slots, kv_heads]` of `buf`,
    with the same strides (two tensors, or views of `scale_pairs`); returns their (slot, head)
    strides in elements."""
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        assert s is not None and s.shape == buf.shape[:2] and s.dtype == torch.float32, (
            f"a {buf.dtype} pool needs {name} float32 [{buf.shape[0]}, {buf.shape[1]}]"
        )
    assert k_scale.stride() == v_scale.stride(), (
        f"k_scale and v_scale must share strides, not {k_scale.stride()} and {v_scale.stride()}"
    )
    return k_scale.stride(0), k_scale.stride(1)


def paired_scales(k_scale: torch.Tensor, v_scale: torch.Tensor) -> bool:
    """`k_scale`, `v_scale` the two halves of a `scale_pairs` tensor: each (slot, head)'s two
    side by side."""
    return (k_scale.stride() == v_scale.stride() == (2 * k_scale.shape[1], 2)
            and v_scale.data_ptr() == k_scale.data_ptr() + k_scale.element_size())


def unscaled_pool(buf: torch.Tensor, k_scale: torch.Tensor | None,
                  v_scale: torch.Tensor | None = None) -> bool:
    """An fp8 pool read and written without scales (a per-tensor scale of 1)."""
    return buf.dtype == torch.float8_e4m3fn and k_scale is None and v_scale is None


def quantize_ref(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize `x [..., D]` to `dtype`, one scale per row: returns (`[..., D]`, f32 `[...]`)."""
    qmax = QUANT_MAX[dtype]
    x = x.float()
    amax = x.abs().amax(-1)  # [...]
    scale = torch.where(amax > 0, amax / qmax, torch.ones_like(amax))  # [...]
    y = x / scale[..., None]
    if dtype == torch.int8:
        y = torch.floor(y + 0.5)
    return y.clamp(-qmax, qmax).to(dtype), scale


def store_rows(x: torch.Tensor, buf: torch.Tensor, at: torch.Tensor,
               scale: torch.Tensor | None = None) -> None:
    """Write rows `x [T, ..., D]` into `buf` at `at [T]`: with `scale` (`[rows, ...]`
    float32, an 8-bit `buf`) quantized one scale a row (`quantize_ref`), else cast. A few
    shape-static torch ops: CUDA graphs capture them."""
    if scale is None:
        buf[at] = x.to(buf.dtype)
    else:
        buf[at], scale[at] = quantize_ref(x, buf.dtype)


def dequantize_ref(q: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """`q [..., D]` times `scale [...]` in float32; a None scale means an unscaled pool (16-bit,
    or fp8 with a per-tensor scale of 1), read in float32 (or in its own dtype when wider)."""
    if scale is None:
        return q.to(torch.float32 if q.dtype in QUANT_MAX else
                    torch.promote_types(q.dtype, torch.float32))  # fmt: skip
    return q.float() * scale[..., None].float()


def store_kv_ref(
    k: torch.Tensor, v: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, slots: torch.Tensor,
    *, k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
) -> None:  # fmt: skip
    """Torch reference of `store_kv` (same in-place contract)."""
    slots = slots.long()
    for x, buf, scale in ((k, k_buf, k_scale), (v, v_buf, v_scale)):
        if buf.dtype in QUANT_MAX and scale is None:  # an unscaled fp8 pool
            buf[slots] = x.float().clamp(-QUANT_MAX[buf.dtype], QUANT_MAX[buf.dtype]).to(buf.dtype)
        elif buf.dtype in QUANT_MAX:
            q, s = quantize_ref(x, buf.dtype)  # [T, H, D], [T, H]
            buf[slots] = q
            scale[slots] = s
        else:
            buf[slots] = x.to(buf.dtype)
