"""Pooling of compression windows: each entry is, per channel, the softmax over its listed
inputs of their gate logits (plus a bias per input) weighting their kv:
`out[e, c] = sum_j softmax_j(gate_j[c] + bias[j % m, s_j, c]) * kv_j[c]` over the inputs
`index[e, j] >= 0`, input j read in its series `s_j = series[j]` (a CSA window mixes two
series of its inputs). An entry listing no input gets 0.

The inputs come from two sources, so that a step reads its own new inputs and the ones its
sequences kept from earlier steps without copying them together: `index < T` names row
`index` of the T new ones, `T + c` cell c of the kept ones. Both are `[rows, series, d]`
views (any row and series stride, channels contiguous), read in float32.

One program per (entry, block of BLOCK_C channels): it walks the list BLOCK_J inputs at a
time, gathering their logits and kv, and folds them into a running max, sum and weighted
kv (the max starts at -inf: a tile of no input folds in as zeros).
"""

import torch
import triton
import triton.language as tl

BLOCK_C = 64
BLOCK_J = 16


@triton.jit
def _gather(new_ptr, kept_ptr, new_off, kept_off, is_new, is_kept, mask_c):
    """Inputs `[BLOCK_J, BLOCK_C]` in float32: at offsets new_off of the new source where
    is_new, kept_off of the kept one where is_kept, 0 where neither."""
    a = tl.load(new_ptr + new_off, mask=is_new[:, None] & mask_c[None, :], other=0.0)
    b = tl.load(kept_ptr + kept_off, mask=is_kept[:, None] & mask_c[None, :], other=0.0)
    return tl.where(is_new[:, None], a.to(tl.float32), b.to(tl.float32))


@triton.jit
def _window_pool_kernel(
    new_kv, new_gate, kept_kv, kept_gate, idx_ptr, series_ptr, bias_ptr,
    o_ptr,  # [E, DIM] contiguous float32
    T, S, m, stride_new, stride_new_s, stride_kept, stride_kept_s, stride_ie, stride_bj,
    stride_bs,
    DIM: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    e = tl.program_id(0).to(tl.int64)
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_c = offs_c < DIM
    run_max = tl.full([BLOCK_C], float("-inf"), tl.float32)
    run_sum = tl.zeros([BLOCK_C], tl.float32)
    acc = tl.zeros([BLOCK_C], tl.float32)
    for j0 in range(0, S, BLOCK_J):
        offs_j = j0 + tl.arange(0, BLOCK_J)
        mask_j = offs_j < S
        idx = tl.load(idx_ptr + e * stride_ie + offs_j, mask=mask_j, other=-1).to(tl.int64)
        s = tl.load(series_ptr + offs_j, mask=mask_j, other=0).to(tl.int64)[:, None]
        is_new = (idx >= 0) & (idx < T)
        is_kept = idx >= T
        new_off = tl.where(is_new, idx, 0)[:, None] * stride_new + s * stride_new_s
        kept_off = tl.where(is_kept, idx - T, 0)[:, None] * stride_kept + s * stride_kept_s
        new_off, kept_off = new_off + offs_c[None, :], kept_off + offs_c[None, :]
        gate = _gather(new_gate, kept_gate, new_off, kept_off, is_new, is_kept, mask_c)
        kv = _gather(new_kv, kept_kv, new_off, kept_off, is_new, is_kept, mask_c)
        bias = tl.load(bias_ptr + (offs_j % m)[:, None] * stride_bj + s * stride_bs
                       + offs_c[None, :], mask=mask_j[:, None] & mask_c[None, :], other=0.0)
        gate = tl.where((idx >= 0)[:, None], gate + bias, float("-inf"))  # [BLOCK_J, BLOCK_C]
        new_max = tl.maximum(run_max, tl.max(gate, 0))
        base = tl.where(new_max == float("-inf"), 0.0, new_max)  # no input yet: all zeros
        p = tl.exp(gate - base[None, :])
        alpha = tl.exp(run_max - base)
        run_sum = run_sum * alpha + tl.sum(p, 0)
        acc = acc * alpha + tl.sum(p * kv, 0)
        run_max = new_max
    out = acc / tl.where(run_sum > 0, run_sum, 1.0)  # no input: acc is 0
    tl.store(o_ptr + e * DIM + offs_c, out, mask=mask_c)


def _check_source(name: str, t: torch.Tensor, d: int) -> None:
    assert t.dim() == 3 and t.shape[2] == d and t.stride(2) == 1, (
        f"{name} must be [rows, series, {d}] contiguous in its last dim, got "
        f"{tuple(t.shape)} strides {t.stride()}"
    )


def window_pool(new_kv: torch.Tensor, new_gate: torch.Tensor, kept_kv: torch.Tensor,
                kept_gate: torch.Tensor, index: torch.Tensor, series: torch.Tensor,
                bias: torch.Tensor) -> torch.Tensor:
    """`[E, d]` float32: each entry's pooled kv. new_kv, new_gate `[T, s, d]` and kept_kv,
    kept_gate `[cells, s', d]` the two sources (any row and series strides); index `[E, S]`
    int32/int64 the inputs of each entry (`< T` new, `T + c` kept cell c, -1 none); series
    `[S]` int the series input j reads; bias `[m, s, d]` float32 contiguous, input j's
    logits get row `j % m`. Indices must lie in their source (not checked: that would read
    them on the host)."""
    d = bias.shape[-1]
    for name, t in (("new_kv", new_kv), ("new_gate", new_gate), ("kept_kv", kept_kv),
                    ("kept_gate", kept_gate)):
        _check_source(name, t, d)
    assert new_kv.stride() == new_gate.stride() and kept_kv.stride() == kept_gate.stride(), (
        "kv and gate of a source must share their strides"
    )
    assert index.dim() == 2 and index.dtype in (torch.int32, torch.int64), (
        f"index must be int32/int64 [E, S], got {index.dtype} {tuple(index.shape)}"
    )
    assert series.shape == (index.shape[1],), (
        f"series must be [{index.shape[1]}], got {tuple(series.shape)}"
    )
    assert bias.dim() == 3 and bias.dtype == torch.float32 and bias.is_contiguous(), (
        f"bias must be a contiguous float32 [m, s, d], got {bias.dtype} {tuple(bias.shape)}"
    )
    E, S = index.shape
    out = torch.empty(E, d, dtype=torch.float32, device=index.device)
    if E == 0:
        return out
    index = index.contiguous()
    _window_pool_kernel[(E, triton.cdiv(d, BLOCK_C))](
        new_kv, new_gate, kept_kv, kept_gate, index, series.contiguous(), bias, out,
        new_kv.shape[0], S, bias.shape[0], new_kv.stride(0), new_kv.stride(1),
        kept_kv.stride(0), kept_kv.stride(1), index.stride(0), bias.stride(0),
        bias.stride(1), DIM=d, BLOCK_J=BLOCK_J, BLOCK_C=BLOCK_C,
    )  # fmt: skip
    return out


def window_pool_ref(new_kv: torch.Tensor, new_gate: torch.Tensor, kept_kv: torch.Tensor,
                    kept_gate: torch.Tensor, index: torch.Tensor, series: torch.Tensor,
                    bias: torch.Tensor) -> torch.Tensor:
    """Torch reference of `window_pool` (same arguments), in float32."""
    T, S = new_kv.shape[0], index.shape[1]
    listed = index >= 0  # [E, S]
    is_new = listed & (index < T)
    at_new = torch.where(is_new, index, 0).long()
    at_kept = torch.where(index >= T, index - T, 0).long()

    def inputs(new: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:  # [E, S, d] float32
        return torch.where(is_new[..., None], new[at_new, series].float(),
                           kept[at_kept, series].float())

    j = torch.arange(S, device=index.device) % bias.shape[0]
    gate = inputs(new_gate, kept_gate) + bias[j, series]  # [E, S, d]
    gate = gate.masked_fill(~listed[..., None], float("-inf"))
    pooled = (inputs(new_kv, kept_kv) * gate.softmax(dim=1)).sum(dim=1)  # [E, d]
    return torch.where(listed.any(dim=1)[:, None], pooled, 0.0)
