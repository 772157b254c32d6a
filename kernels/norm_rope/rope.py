"""Rotary position embedding, NeoX / HF-Llama style: the two halves of head_dim rotate together.

The cache row for position p is `[cos(p * f_0..f_{D/2-1}) | sin(p * f_0..f_{D/2-1})]`; the
frequencies follow HF transformers for each of `ROPE_TYPES`.
"""

import math

import torch
import triton
import triton.language as tl

ROPE_TYPES = ("default", "linear", "llama3")


@triton.jit
def cos_sin_row(cache_ptr, pos, stride_c, freq, mask, HALF: tl.constexpr):
    """Position `pos`'s cos and sin of frequencies `freq` `[N]` (where `mask`) from the
    `rope_cos_sin_cache` table (HALF columns of each), float32 `[1, N]` each."""
    row = cache_ptr + pos * stride_c
    cos = tl.load(row + freq, mask=mask, other=0.0).to(tl.float32)
    sin = tl.load(row + HALF + freq, mask=mask, other=0.0).to(tl.float32)
    return cos[None, :], sin[None, :]


@triton.jit
def _rotate(
    row_ptr, stride_h, cos, sin,
    HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
):  # fmt: skip
    """Rotate one token's heads in place: [x1, x2] -> [x1 cos - x2 sin, x2 cos + x1 sin]."""
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_HALF)
    mask = (offs_h[:, None] < HEADS) & (offs_d[None, :] < HALF)  # [BLOCK_H, BLOCK_HALF]
    ptrs = row_ptr + offs_h[:, None] * stride_h + offs_d[None, :]
    x1 = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptrs + HALF, mask=mask, other=0.0).to(tl.float32)
    tl.store(ptrs, (x1 * cos - x2 * sin).to(row_ptr.dtype.element_ty), mask=mask)
    tl.store(ptrs + HALF, (x2 * cos + x1 * sin).to(row_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _apply_rope_kernel(
    q_ptr, k_ptr, positions_ptr, cache_ptr, stride_qt, stride_qh, stride_kt, stride_kh, stride_c,
    Q_HEADS: tl.constexpr, K_HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0)
    pos = tl.load(positions_ptr + t).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_HALF)
    cos, sin = cos_sin_row(cache_ptr, pos, stride_c, offs_d, offs_d < HALF, HALF)  # [1, BLOCK_HALF]
    _rotate(q_ptr + t * stride_qt, stride_qh, cos, sin, Q_HEADS, HALF, BLOCK_HQ, BLOCK_HALF)
    _rotate(k_ptr + t * stride_kt, stride_kh, cos, sin, K_HEADS, HALF, BLOCK_HK, BLOCK_HALF)


def rope_inv_freq(head_dim: int, base: float, scaling: dict | None) -> torch.Tensor:
    """Rotation frequencies `[head_dim / 2]` in float32 on the CPU, as HF's rope init functions.

    `scaling` is a HF `rope_scaling` dict: None or rope_type (or type) "default"; "linear"
    with factor (positions divided by it, so the frequencies are); "llama3" with factor,
    low_freq_factor, high_freq_factor, original_max_position_embeddings.
    """
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"unsupported rope_type {rope_type!r} {ROPE_TYPES}")
    if rope_type == "default":
        return inv_freq
    factor = scaling["factor"]
    if rope_type == "linear":
        return inv_freq / factor
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths are slowed by `factor`, short ones kept, the band between interpolated.
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_cos_sin_cache(
    head_dim: int,
    max_pos: int,
    base: float,
    scaling: dict | None,
    device: torch.device | str,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """`[max_pos, head_dim]`: cos of every (position, frequency) in the first half, sin after,
    computed on `device` as transformers computes them there. `scaling` as `rope_inv_freq`.
    """
    assert head_dim % 2 == 0, f"head_dim {head_dim} must be even"
    inv_freq = rope_inv_freq(head_dim, base, scaling).to(device)  # [head_dim / 2]
    pos = torch.arange(max_pos, dtype=torch.float32, device=device)  # [max_pos]
    freqs = torch.outer(pos, inv_freq)  # [max_pos, D/2]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(dtype)


def apply_rope(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> None:
    """Rotate q `[T, Hq, D]` and k `[T, Hkv, D]` in place at `positions [T]` (int32/int64),
    HF `rotate_half` convention, in float32. cos_sin_cache `[max_pos, D]` from
    `rope_cos_sin_cache`."""
    assert q.dim() == 3 and k.dim() == 3, f"q {tuple(q.shape)}, k {tuple(k.shape)} must be 3-D"
    T, Hq, D = q.shape
    assert k.shape[0] == T and k.shape[2] == D, f"k {tuple(k.shape)} must be [{T}, Hkv, {D}]"
    assert q.dtype == k.dtype, f"q {q.dtype} and k {k.dtype} differ"
    assert D % 2 == 0, f"head_dim {D} must be even"
    assert q.stride(2) == 1 and k.stride(2) == 1, "q and k must be contiguous along head_dim"
    assert positions.shape == (T,) and positions.dtype in (torch.int32, torch.int64), (
        f"positions must be int32/int64 [{T}], got {positions.dtype} {tuple(positions.shape)}"
    )
    assert cos_sin_cache.dim() == 2 and cos_sin_cache.shape[1] == D, (
        f"cos_sin_cache {tuple(cos_sin_cache.shape)} must be [max_pos, {D}]"
    )
    assert cos_sin_cache.stride(1) == 1, "cos_sin_cache must be contiguous along head_dim"
    if T == 0:
        return
    Hkv = k.shape[1]
    _apply_rope_kernel[(T,)](
        q, k, positions.contiguous(), cos_sin_cache,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_sin_cache.stride(0),
        Q_HEADS=Hq, K_HEADS=Hkv, HALF=D // 2, BLOCK_HQ=triton.next_power_of_2(Hq),
        BLOCK_HK=triton.next_power_of_2(Hkv), BLOCK_HALF=triton.next_power_of_2(D // 2),
    )  # fmt: skip


def apply_rope_ref(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """HF `apply_rotary_pos_emb` (rotate_half) in float32; returns new (q, k)."""
    cos, sin = cos_sin_cache[positions.long()].float().chunk(2, dim=-1)  # [T, D/2] each
    cos = torch.cat([cos, cos], dim=-1)[:, None, :]  # [T, 1, D]
    sin = torch.cat([sin, sin], dim=-1)[:, None, :]  # [T, 1, D]

    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([-x2, x1], dim=-1)

    qf, kf = q.float(), k.float()
    q_out = qf * cos + rotate_half(qf) * sin  # [T, Hq, D]
    k_out = kf * cos + rotate_half(kf) * sin  # [T, Hkv, D]
    return q_out.to(q.dtype), k_out.to(k.dtype)
