"""Mixture-of-experts FFN over routed tokens: for each of a token's k picks,
silu(x @ gate^T) * (x @ up^T) @ down^T of the picked expert, scaled by the pick's weight and
summed over the picks. With a `swiglu_limit` L > 0 the gate is clamped to at most L and up to
[-L, L] before the product (the clamped SwiGLU of some MoE families).

Two grouped GEMMs over the picks sorted by expert (`moe_align_block_size`): the first
multiplies by `w13` and fuses silu(gate) * up (it holds a gate and an up accumulator per
tile), the second multiplies by `w2` and applies the routing weight; a sum over k ends it.
Every buffer is sized for the worst case, so the launch is CUDA-graph safe.
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.moe.align import moe_align_block_size


@dataclass(frozen=True)
class MoeConfig:
    """Tiles of the grouped GEMMs. `block_m` is also the expert-run alignment."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int = 1
    num_warps: int = 4
    num_stages: int = 3


def moe_config(num_tokens: int, top_k: int, num_experts: int) -> MoeConfig:
    """Tiles by the mean rows per expert: thin row blocks while the GEMMs are weight
    bound (decode), wide ones once each expert sees many tokens."""
    rows_per_expert = num_tokens * top_k / num_experts
    if rows_per_expert <= 1:
        return MoeConfig(16, 64, 128, num_stages=4)
    if rows_per_expert <= 32:
        return MoeConfig(32, 64, 128, num_stages=3)
    return MoeConfig(64, 128, 64, group_m=8, num_stages=3)


@triton.jit(do_not_specialize=["num_picks", "num_blocks_m"])  # one compile for every T
def _moe_gemm_kernel(
    a_ptr, b_ptr, c_ptr, weight_ptr, sorted_ids_ptr, block_expert_ptr, num_padded_ptr,
    N, K, num_picks, num_blocks_m, limit,
    stride_am, stride_be, stride_bn, stride_cm,
    A_ROW_DIV: tl.constexpr,
    GATED: tl.constexpr,
    CLAMP: tl.constexpr,
    MUL_WEIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):  # fmt: skip
    """C[r, n] = A[r // A_ROW_DIV] . B[expert(r), n] over the sorted rows r of one tile.

    GATED: B holds 2N rows (gate, then up) and C gets silu(gate) * up; CLAMP: gate clamped
    to at most `limit` and up to [-limit, limit] first. MUL_WEIGHT: C is
    scaled by the pick's routing weight. B is [E, N(*2), K] with K contiguous.
    """
    pid = tl.program_id(0)
    num_blocks_n = tl.cdiv(N, BLOCK_N)
    # Grouped order: GROUP_M row blocks sweep the columns together, sharing B tiles in L2.
    per_group = GROUP_M * num_blocks_n
    first_m = (pid // per_group) * GROUP_M
    group_size = tl.minimum(num_blocks_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_size
    pid_n = (pid % per_group) // group_size
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = tl.load(sorted_ids_ptr + offs_m).to(tl.int64)  # [BM] flat pick t * k + j
    row_mask = rows < num_picks
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)

    a_ptrs = a_ptr + (rows // A_ROW_DIV)[:, None] * stride_am + offs_k[None, :]  # [BM, BK]
    b_ptrs = b_ptr + expert * stride_be + offs_n[None, :] * stride_bn + offs_k[:, None]  # [BK, BN]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_mask = offs_k < K - k0
        a = tl.load(a_ptrs, mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        b_mask = k_mask[:, None] & n_mask[None, :]
        acc = tl.dot(a, tl.load(b_ptrs, mask=b_mask, other=0.0), acc)
        if GATED:
            b_up = tl.load(b_ptrs + N * stride_bn, mask=b_mask, other=0.0)
            acc_up = tl.dot(a, b_up, acc_up)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K

    if GATED:
        if CLAMP:
            acc = tl.minimum(acc, limit)
            acc_up = tl.minimum(tl.maximum(acc_up, -limit), limit)
        acc = acc / (1.0 + tl.exp(-acc)) * acc_up
    if MUL_WEIGHT:
        w = tl.load(weight_ptr + rows, mask=row_mask, other=0.0)  # [BM]
        acc = acc * w[:, None]
    c_ptrs = c_ptr + rows[:, None] * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=row_mask[:, None] & n_mask[None, :])


def _moe_gemm(a, b, c, weights, align, n, k, cfg: MoeConfig, *, a_row_div, gated, mul_weight,
              limit=0.0):
    num_blocks_m = align.block_expert.numel()
    grid = (num_blocks_m * triton.cdiv(n, cfg.block_n),)
    _moe_gemm_kernel[grid](
        a, b, c, weights, align.sorted_ids, align.block_expert, align.num_padded,
        n, k, c.shape[0], num_blocks_m, float(limit),
        a.stride(0), b.stride(0), b.stride(1), c.stride(0),
        A_ROW_DIV=a_row_div, GATED=gated, CLAMP=limit > 0, MUL_WEIGHT=mul_weight,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip


def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    *,
    swiglu_limit: float = 0.0,
    config: MoeConfig | None = None,
) -> torch.Tensor:
    """Routed experts' FFN: x `[T, H]` -> `[T, H]` (x's dtype).

    w13 `[E, 2I, H]` holds each expert's gate rows then up rows, w2 `[E, H, I]` its down
    projection; weights `[T, k]` fp32 and ids `[T, k]` int32 come from `grouped_topk`.
    Under tensor parallelism each rank passes its shard of the experts' width (I split
    over ranks, all E experts on every rank) and gets a partial sum: the caller
    all-reduces it. Shared experts are not included. Accumulates in fp32. `swiglu_limit`
    > 0 clamps gate and up (module docstring).
    """
    T, H = x.shape
    E, two_i, h13 = w13.shape
    inter = two_i // 2
    top_k = ids.shape[1]
    assert h13 == H and w2.shape == (E, H, inter), f"w13 {w13.shape} / w2 {w2.shape} vs H {H}"
    assert weights.shape == ids.shape == (T, top_k), f"weights {weights.shape}, ids {ids.shape}"
    assert x.stride(1) == 1 and w13.stride(2) == 1 and w2.stride(2) == 1, "K must be contiguous"
    weights = weights.float().contiguous()  # [T, k], read at flat pick t * k + j
    ids = ids.to(torch.int32).contiguous()  # [T, k]
    if T == 0:
        return x.new_zeros(T, H)
    cfg = config or moe_config(T, top_k, E)
    align = moe_align_block_size(ids, E, cfg.block_m)
    act = torch.empty(T * top_k, inter, dtype=x.dtype, device=x.device)  # [T*k, I]
    _moe_gemm(x, w13, act, weights, align, inter, H, cfg, a_row_div=top_k, gated=True,
              mul_weight=False, limit=swiglu_limit)  # fmt: skip
    out = torch.empty(T * top_k, H, dtype=x.dtype, device=x.device)  # [T*k, H]
    _moe_gemm(act, w2, out, weights, align, H, inter, cfg, a_row_div=1, gated=False,
              mul_weight=True)  # fmt: skip
    return out.view(T, top_k, H).sum(dim=1)


def fused_moe_ref(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor,
                  ids: torch.Tensor, *, swiglu_limit: float = 0.0) -> torch.Tensor:
    """Torch reference of `fused_moe`, in float32 with one pass per expert that is hit
    (it syncs with the host to find them: not for CUDA graphs)."""
    T, H = x.shape
    inter = w13.shape[1] // 2
    out = torch.zeros(T, H, dtype=torch.float32, device=x.device)  # [T, H]
    xf = x.float()
    for e in ids.unique().tolist():
        tok, pick = torch.where(ids == e)  # [n] each
        h = xf[tok] @ w13[e].float().t()  # [n, 2I]
        gate, up = h[:, :inter], h[:, inter:]  # [n, I] each
        if swiglu_limit > 0:
            gate, up = gate.clamp(max=swiglu_limit), up.clamp(-swiglu_limit, swiglu_limit)
        act = torch.nn.functional.silu(gate) * up  # [n, I]
        y = act @ w2[e].float().t()  # [n, H]
        out.index_add_(0, tok, y * weights[tok, pick].float().unsqueeze(-1))
    return out.to(x.dtype)
