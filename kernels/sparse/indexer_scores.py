"""The indexer's scores of queries against compressed index keys:
`score[q, n] = scale * sum_h weights[q, h] * relu(q_idx[q, h] . keys[n])` over the entries
query q sees (n < visible_upto[q]), -inf elsewhere. The top-k of a row (`top_entries`) are
the entries that query attends.

One program per (query, tile of BLOCK_N keys): the query's h heads are the rows of one
tl.dot against the key tile (heads in blocks of BLOCK_H), the relu'd products weighted and
summed over the heads in float32. A tile past the query's visible entries loads nothing.
"""

import torch
import triton
import triton.language as tl

BLOCK_H = 16
BLOCK_N = 64


@triton.jit
def _indexer_scores_kernel(
    q_ptr, w_ptr, k_ptr, upto_ptr,
    o_ptr,  # [Q, n] contiguous float32
    scale, heads, n, stride_qq, stride_qh, stride_wq, stride_wh, stride_kn,
    DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    qi = tl.program_id(0).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    upto = tl.minimum(tl.load(upto_ptr + qi), n)
    seen = offs_n < upto  # [BLOCK_N]
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < DIM
    total = tl.zeros([BLOCK_N], tl.float32)
    if tl.program_id(1) * BLOCK_N < upto:  # the tile holds a visible entry
        keys = tl.load(k_ptr + offs_n.to(tl.int64)[:, None] * stride_kn + offs_d[None, :],
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
                   visible_upto: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """`[Q, n]` float32 scores of queries q_idx `[Q, h, di]` (any strides but the last)
    against keys `[n, di]` (rows any stride apart, read in q_idx's dtype), each head's relu'd
    product weighted by weights `[Q, h]` (float, any strides) and summed, times scale
    (default di**-0.5); -inf at entries n >= visible_upto[q] (`[Q]` int32/int64: for entries
    of `rate` tokens and queries at positions p, (p + 1) // rate)."""
    assert q_idx.dim() == 3 and q_idx.stride(-1) == 1, (
        f"q_idx must be [Q, h, di] contiguous in di, got {tuple(q_idx.shape)}"
    )
    Q, h, di = q_idx.shape
    assert keys.dim() == 2 and keys.shape[1] == di and keys.stride(1) == 1, (
        f"keys must be [n, {di}] contiguous in di, got {tuple(keys.shape)}"
    )
    assert weights.shape == (Q, h) and weights.is_floating_point(), (
        f"weights must be a float [{Q}, {h}], got {weights.dtype} {tuple(weights.shape)}"
    )
    assert visible_upto.shape == (Q,) and visible_upto.dtype in (torch.int32, torch.int64), (
        f"visible_upto must be int32/int64 [{Q}], got {visible_upto.dtype} "
        f"{tuple(visible_upto.shape)}"
    )
    n = keys.shape[0]
    out = torch.empty(Q, n, dtype=torch.float32, device=q_idx.device)
    if Q == 0 or n == 0:
        return out
    _indexer_scores_kernel[(Q, triton.cdiv(n, BLOCK_N))](
        q_idx, weights, keys, visible_upto.contiguous(), out,
        di**-0.5 if scale is None else scale, h, n, q_idx.stride(0), q_idx.stride(1),
        weights.stride(0), weights.stride(1), keys.stride(0), DIM=di, BLOCK_H=BLOCK_H,
        BLOCK_N=BLOCK_N, BLOCK_D=max(16, triton.next_power_of_2(di)),
    )  # fmt: skip
    return out


def indexer_scores_ref(q_idx: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor,
                       visible_upto: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Torch reference of `indexer_scores` (same arguments), in float32 (keys rounded to
    q_idx's dtype first, as the kernel reads them)."""
    di = q_idx.shape[2]
    keys = keys.to(q_idx.dtype).float()
    heads = torch.relu(torch.einsum("qhd,nd->qhn", q_idx.float(), keys))  # [Q, h, n]
    scores = (heads * weights.float()[:, :, None]).sum(1) * (di**-0.5 if scale is None else scale)
    seen = torch.arange(keys.shape[0], device=keys.device)[None, :] < visible_upto[:, None]
    return scores.masked_fill(~seen, float("-inf"))  # [Q, n]
