"""Sparse MQA attention with a sink: every query token reads its own list of key slots.

All query heads share one K=V head of head_dim d: a key's row is also its value. Query t's
keys are the rows at the slots `indices[t]` (-1: no key) of a pool view `kv` `[slots, d]`,
and optionally those at `entry_indices[t]` of a second view `entry_kv` (another column range
of the same rows, say), all in one softmax whose denominator also holds a learned per-head
sink `exp(sink[h])`, which adds no value. The same kernel serves decode (one token a
sequence) and extend: the caller builds the lists (`kernels.sparse.index_lists`).

Either view may be float8_e4m3fn codes with one float32 scale a row (`kv_scale`,
`entry_scale`: the rows `kernels.kv.store.store_rows` writes): a row's codes widen to q's
dtype exactly, and its scale multiplies its score and, after the softmax, its weight, so
that no tile is rescaled.

One program per (query token, block of BLOCK_H heads): it walks the lists BLOCK_K slots at a
time, gathers those rows once for the head block, scores them with tl.dot and folds them into
the running softmax (`kernels.attention.online_softmax`), in float32. The running max starts
at the sink's logit and the running sum at its weight 1, so that the max is finite before the
first key and a tile whose slots are all -1 folds in as zeros: -1 may stand anywhere in a
list, and a query with no key at all gets 0.
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.attention.decode import LOG2E, output_buffer
from kernels.attention.decode_config import LaunchConfig
from kernels.attention.online_softmax import softmax_fold

SINK_TO_BASE2 = tl.constexpr(LOG2E)  # the sink's logit joins the base-2 scores


@dataclass(frozen=True)
class SparseMqaConfig(LaunchConfig):
    """Launch knobs: heads a program (block_h) and slots a tile (block_k). Not yet measured
    on a GPU: the defaults (`sparse_mqa_config`) take MLA decode's tiles, whose 512-wide
    float32 accumulator of 16 heads fits in registers with 8 warps."""

    TILES = ("block_h", "block_k")
    block_h: int = 16
    block_k: int = 32
    num_warps: int = 8
    num_stages: int = 2


def sparse_mqa_config(head_dim: int) -> SparseMqaConfig:
    """The default launch config for rows of head_dim values: wider tiles, fewer warps for
    narrow rows (64, 128)."""
    if head_dim <= 128:
        return SparseMqaConfig(block_k=64, num_warps=4)
    return SparseMqaConfig()


@triton.jit
def _fold_listed_rows(q, m, l_sum, acc, kv_ptr, stride_kv, scale_ptr, stride_scale, idx_ptr,
                      num_keys, offs_d, mask_d, qk_scale, QUANT: tl.constexpr,
                      BLOCK_K: tl.constexpr):
    """Fold the rows at the num_keys slots listed at idx_ptr (-1: none) of the view kv_ptr
    (rows stride_kv apart; when QUANT, e4m3 codes whose scales lie stride_scale apart at
    scale_ptr) into the running (max m, sum l_sum `[BLOCK_H]`, acc `[BLOCK_H, BLOCK_D]`) of
    the queries q `[BLOCK_H, BLOCK_D]`, each row serving as key and value."""
    for k0 in range(0, num_keys, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        slot = tl.load(idx_ptr + offs_k, mask=offs_k < num_keys, other=-1)  # [BLOCK_K]
        valid = slot >= 0
        row = kv_ptr + slot.to(tl.int64)[:, None] * stride_kv + offs_d[None, :]
        kv = tl.load(row, mask=valid[:, None] & mask_d[None, :], other=0.0)  # [BLOCK_K, BLOCK_D]
        kv = kv.to(q.dtype)  # exact for e4m3 codes
        qk = tl.dot(q, tl.trans(kv))  # [BLOCK_H, BLOCK_K]
        if QUANT:
            row_scale = tl.load(scale_ptr + slot.to(tl.int64) * stride_scale, mask=valid,
                                other=0.0)  # [BLOCK_K]
            qk = qk * row_scale[None, :]
        qk = tl.where(valid[None, :], qk * qk_scale, float("-inf"))
        m, l_sum, alpha, p = softmax_fold(qk, m, l_sum)  # p [BLOCK_H, BLOCK_K]
        if QUANT:
            p = p * row_scale[None, :]
        acc = acc * alpha[:, None] + tl.dot(p.to(kv.dtype), kv)
    return m, l_sum, acc


@triton.jit
def _sparse_mqa_kernel(
    q_ptr, kv_ptr, idx_ptr, entry_kv_ptr, entry_idx_ptr, sink_ptr,
    kv_scale_ptr, entry_scale_ptr,  # read only when QUANT / ENTRY_QUANT
    o_ptr,  # [T, heads, HEAD_DIM] contiguous, q's dtype
    qk_scale,  # scale * log2(e): the softmax runs in base 2
    heads, num_keys, num_entries, stride_qt, stride_qh, stride_kv, stride_it, stride_entry_kv,
    stride_entry_it, stride_kv_scale, stride_entry_scale,
    HEAD_DIM: tl.constexpr, ENTRIES: tl.constexpr, QUANT: tl.constexpr,
    ENTRY_QUANT: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < heads
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    q = tl.load(q_ptr + t * stride_qt + offs_h[:, None] * stride_qh + offs_d[None, :],
                mask=mask_h[:, None] & mask_d[None, :], other=0.0)  # [BLOCK_H, BLOCK_D]
    # the sink opens the softmax: its base-2 logit is the first max, its weight 1 the first sum
    m = tl.load(sink_ptr + offs_h, mask=mask_h, other=0.0).to(tl.float32) * SINK_TO_BASE2
    l_sum = tl.full([BLOCK_H], 1.0, tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    m, l_sum, acc = _fold_listed_rows(q, m, l_sum, acc, kv_ptr, stride_kv, kv_scale_ptr,
                                      stride_kv_scale, idx_ptr + t * stride_it, num_keys,
                                      offs_d, mask_d, qk_scale, QUANT, BLOCK_K)
    if ENTRIES:
        m, l_sum, acc = _fold_listed_rows(q, m, l_sum, acc, entry_kv_ptr, stride_entry_kv,
                                          entry_scale_ptr, stride_entry_scale,
                                          entry_idx_ptr + t * stride_entry_it, num_entries,
                                          offs_d, mask_d, qk_scale, ENTRY_QUANT, BLOCK_K)
    o = acc / l_sum[:, None]
    o_offs = (t * heads + offs_h[:, None]) * HEAD_DIM + offs_d[None, :]
    tl.store(o_ptr + o_offs, o.to(o_ptr.dtype.element_ty), mask=mask_h[:, None] & mask_d[None, :])


def _check_list(name: str, kv: torch.Tensor, indices: torch.Tensor, T: int, d: int,
                scale: torch.Tensor | None) -> tuple[torch.Tensor, int]:
    """A key source: kv `[slots, d]` contiguous in d (e4m3 codes with scale `[slots]`
    float32, else 16/32-bit and no scale), indices `[T, K]` int32/int64; returns (the
    scales, or kv as an unread placeholder, and their stride)."""
    assert kv.dim() == 2 and kv.shape[1] == d and kv.stride(1) == 1, (
        f"{name} view must be [slots, {d}] contiguous in its last dim, got {tuple(kv.shape)} "
        f"strides {kv.stride()}"
    )
    if kv.dtype == torch.float8_e4m3fn:
        assert scale is not None and scale.shape == kv.shape[:1] and (
            scale.dtype == torch.float32), (
            f"an e4m3 {name} view needs its scales float32 [{kv.shape[0]}]"
        )
    else:
        assert kv.dtype in (torch.float32, torch.float16, torch.bfloat16) and scale is None, (
            f"{name} view must be float32/float16/bfloat16 (or e4m3 with scales), got "
            f"{kv.dtype}"
        )
    assert indices.dim() == 2 and indices.shape[0] == T and indices.stride(1) == 1, (
        f"{name} indices must be [{T}, K] contiguous in K, got {tuple(indices.shape)}"
    )
    assert indices.dtype in (torch.int32, torch.int64), (
        f"{name} indices must be int32/int64, got {indices.dtype}"
    )
    return (kv, 0) if scale is None else (scale, scale.stride(0))


def sparse_mqa_attention(
    q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sink: torch.Tensor, scale: float,
    *, entry_kv: torch.Tensor | None = None, entry_indices: torch.Tensor | None = None,
    kv_scale: torch.Tensor | None = None, entry_scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None, config: SparseMqaConfig | None = None,
) -> torch.Tensor:  # fmt: skip
    """Attention of each query token over the rows its lists name; returns `[T, H, d]` in q's
    dtype.

    q `[T, H, d]` (any strides but the last); kv `[slots, d]` the K=V rows (a view into wider
    pool rows is fine, e.g. one column range: only the last stride must be 1), float32 /
    float16 / bfloat16, read in q's dtype; indices `[T, K]` int32/int64 slots of kv, -1 for
    none (anywhere in a row; a slot listed twice counts twice); sink `[H]` float, the
    per-head logit added to every softmax's denominator; scale multiplies q . k (d**-0.5).
    entry_kv `[slots', d]` and entry_indices `[T, K']` (both or neither) name more keys from
    a second view, folded into the same softmax. A float8_e4m3fn view comes with its rows'
    float32 scales, `kv_scale` / `entry_scale` `[slots]` (any stride): row x reads as
    `x * scale`. A query with no key gets 0. Slots must lie
    in their view (not checked: that would read them on the host). `out` (contiguous, q's
    shape and dtype) receives the output if given; `config` overrides `sparse_mqa_config`.
    """
    assert q.dim() == 3 and q.stride(-1) == 1, (
        f"q must be [T, H, d] contiguous in d, got {tuple(q.shape)} strides {q.stride()}"
    )
    T, H, d = q.shape
    kv_scales = _check_list("kv", kv, indices, T, d, kv_scale)
    assert (entry_kv is None) == (entry_indices is None), (
        "entry_kv and entry_indices come together"
    )
    entries = entry_kv is not None
    if entries:
        entry_scales = _check_list("entry_kv", entry_kv, entry_indices, T, d, entry_scale)
    else:  # placeholders, unread: ENTRIES is off
        entry_kv, entry_indices, entry_scales = kv, indices, (kv, 0)
    assert sink.shape == (H,) and sink.is_floating_point(), (
        f"sink must be a float [{H}], got {sink.dtype} {tuple(sink.shape)}"
    )
    out = output_buffer(out, (T, H, d), q)
    if T == 0:
        return out
    config = config or sparse_mqa_config(d)
    _sparse_mqa_kernel[(T, triton.cdiv(H, config.block_h))](
        q, kv, indices, entry_kv, entry_indices, sink.contiguous(), kv_scales[0],
        entry_scales[0], out, scale * LOG2E, H, indices.shape[1], entry_indices.shape[1],
        q.stride(0), q.stride(1), kv.stride(0), indices.stride(0), entry_kv.stride(0),
        entry_indices.stride(0), kv_scales[1], entry_scales[1], HEAD_DIM=d, ENTRIES=entries,
        QUANT=kv_scale is not None, ENTRY_QUANT=entry_scale is not None,
        BLOCK_H=config.block_h, BLOCK_K=config.block_k,
        BLOCK_D=max(16, triton.next_power_of_2(d)), num_warps=config.num_warps,
        num_stages=config.num_stages,
    )  # fmt: skip
    return out


def sparse_mqa_attention_ref(
    q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sink: torch.Tensor, scale: float,
    *, entry_kv: torch.Tensor | None = None, entry_indices: torch.Tensor | None = None,
    kv_scale: torch.Tensor | None = None, entry_scale: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """Torch reference of `sparse_mqa_attention` (same arguments), in float32 (or q's wider
    dtype): gather every listed row (-1 reads row 0, masked), one softmax with the sink."""
    acc = torch.promote_types(q.dtype, torch.float32)
    rows, valid = _listed_rows(kv, kv_scale, indices, q.dtype)  # [T, K, d], [T, K]
    if entry_kv is not None:
        more, more_valid = _listed_rows(entry_kv, entry_scale, entry_indices, q.dtype)
        rows, valid = torch.cat([rows, more], 1), torch.cat([valid, more_valid], 1)
    rows = rows.to(acc)
    scores = torch.einsum("thd,tkd->thk", q.to(acc), rows) * scale  # [T, H, K]
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    sink = sink.to(acc)[None, :, None].expand(q.shape[0], -1, 1)  # [T, H, 1]
    probs = torch.cat([scores, sink], dim=-1).softmax(dim=-1)[..., :-1]  # [T, H, K]
    return torch.einsum("thk,tkd->thd", probs, rows).to(q.dtype)


def _listed_rows(kv: torch.Tensor, scale: torch.Tensor | None, indices: torch.Tensor,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows `[T, K, d]`, valid `[T, K]`): the rows `indices` name, row 0 for -1, in dtype
    (codes times their row's `scale` in float32, as the kernel folds them in)."""
    valid = indices >= 0
    at = torch.where(valid, indices, 0).long()  # [T, K]
    if scale is None:
        return kv[at].to(dtype), valid
    return kv[at].to(dtype).float() * scale[at][..., None], valid
