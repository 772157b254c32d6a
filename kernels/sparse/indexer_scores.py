"""The indexer's scores of queries against compressed index keys named by per-query lists:
`score[q, j] = scale * sum_h weights[q, h] * relu(q_idx[q, h] . keys[key_indices[q, j]])`,
-inf where `key_indices[q, j]` is -1. One call scores a whole step: each query lists its
own sequence's keys (`index_lists.visible_entries` through `entry_indices`: column j is
entry j, -1 past those it sees), and the top-k of a row (`top_entries`) are the entries
that query attends.

One program per (query, tile of BLOCK_N list slots): the tile's key rows are gathered once,
the query's h heads are the rows of one tl.dot against them (heads in blocks of BLOCK_H),
the relu'd products weighted and summed over the heads in float32. A tile listing no key
gathers nothing.
"""

import torch
import triton
import triton.language as tl

BLOCK_H = 16
BLOCK_N = 64


@triton.jit
def _indexer_scores_kernel(
    q_ptr, w_ptr, k_ptr, idx_ptr,
    o_ptr,  # [Q, n] contiguous float32
    scale, heads, n, stride_qq, stride_qh, stride_wq, stride_wh, stride_kn, stride_iq,
    DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    qi = tl.program_id(0).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    slot = tl.load(idx_ptr + qi * stride_iq + offs_n, mask=offs_n < n, other=-1)  # [BLOCK_N]
    seen = slot >= 0
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < DIM
    total = tl.zeros([BLOCK_N], tl.float32)
    if tl.max(slot, 0) >= 0:  # the tile lists a key
        keys = tl.load(k_ptr + slot.to(tl.int64)[:, None] * stride_kn + offs_d[None, :],
                       mask=seen[:, None] & mask_d[None, :], other=0.0)  # [BLOCK_N, BLOCK_D]
        for h0 in range(0, heads, BLOCK_H):
            offs_h = h0 + tl.arange(0, BLOCK_H)
            mask_h = offs_h < heads
            q = tl.load(q_ptr + qi * stride_qq + offs_h[:, None] * stride_qh + offs_d[None, :],
                        mask=mask_h[:, None] & mask_d[None, :], other=0.0)  # [BLOCK_H, BLOCK_D]
            s = tl.dot(q, tl.trans(keys.to(q.dtype)))  # [BLOCK_H, BLOCK_N]
            w = tl.load(w_ptr + qi * stride_wq + offs_h * stride_wh, mask=mask_h, other=0.0)
            total += tl.sum(w.to(tl.float32)[:, None] * tl.maximum(s, 0.0), 0)
    score = tl.where(seen, total * scale, float("-inf"))
    tl.store(o_ptr + qi * n + offs_n, score, mask=offs_n < n)


def indexer_scores(q_idx: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor,
                   key_indices: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """`[Q, n]` float32 scores of queries q_idx `[Q, h, di]` (any strides but the last)
    against the rows of keys `[slots, di]` (rows any stride apart, read in q_idx's dtype)
    that key_indices `[Q, n]` (int32/int64, contiguous in n) lists, -1 for none: each
    head's relu'd product weighted by weights `[Q, h]` (float, any strides) and summed,
    times scale (default di**-0.5); -inf where the list holds -1. Slots must lie in keys
    (not checked: that would read them on the host)."""
    assert q_idx.dim() == 3 and q_idx.stride(-1) == 1, (
        f"q_idx must be [Q, h, di] contiguous in di, got {tuple(q_idx.shape)}"
    )
    Q, h, di = q_idx.shape
    assert keys.dim() == 2 and keys.shape[1] == di and keys.stride(1) == 1, (
        f"keys must be [slots, {di}] contiguous in di, got {tuple(keys.shape)}"
    )
    assert weights.shape == (Q, h) and weights.is_floating_point(), (
        f"weights must be a float [{Q}, {h}], got {weights.dtype} {tuple(weights.shape)}"
    )
    assert (key_indices.dim() == 2 and key_indices.shape[0] == Q
            and key_indices.dtype in (torch.int32, torch.int64)), (
        f"key_indices must be int32/int64 [{Q}, n], got {key_indices.dtype} "
        f"{tuple(key_indices.shape)}"
    )  # fmt: skip
    n = key_indices.shape[1]
    out = torch.empty(Q, n, dtype=torch.float32, device=q_idx.device)
    if Q == 0 or n == 0:
        return out
    key_indices = key_indices.contiguous()
    _indexer_scores_kernel[(Q, triton.cdiv(n, BLOCK_N))](
        q_idx, weights, keys, key_indices, out,
        di**-0.5 if scale is None else scale, h, n, q_idx.stride(0), q_idx.stride(1),
        weights.stride(0), weights.stride(1), keys.stride(0), key_indices.stride(0), DIM=di,
        BLOCK_H=BLOCK_H, BLOCK_N=BLOCK_N, BLOCK_D=max(16, triton.next_power_of_2(di)),
    )  # fmt: skip
    return out


def indexer_scores_ref(q_idx: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor,
                       key_indices: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Torch reference of `indexer_scores` (same arguments), in float32 (keys rounded to
    q_idx's dtype first, as the kernel reads them; -1 reads row 0, masked)."""
    di = q_idx.shape[2]
    seen = key_indices >= 0  # [Q, n]
    listed = keys[torch.where(seen, key_indices, 0).long()].to(q_idx.dtype).float()  # [Q, n, di]
    heads = torch.relu(torch.einsum("qhd,qnd->qhn", q_idx.float(), listed))  # [Q, h, n]
    scores = (heads * weights.float()[:, :, None]).sum(1) * (di**-0.5 if scale is None else scale)
    return scores.masked_fill(~seen, float("-inf"))  # [Q, n]
