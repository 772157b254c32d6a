"""Elementwise layer ops behind one interface: the kernels' torch references on the CPU,
the Triton kernels on a GPU.

The model calls `ops.rmsnorm`, `ops.add_rmsnorm` (residual add fused with the norm),
`ops.rope`, `ops.silu_mul`, `ops.fused_moe` (routed experts) and `ops.sparse` (DeepSeek-V4's
sparse attention: `SparseAttention`); `TorchOps` calls each
kernel's `*_ref` (the CPU correctness reference, equal to transformers in float32),
`TritonOps` launches the kernels in `kernels/`. Both take the RoPE table of
`kernels.rope.rope_cos_sin_cache`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from kernels.moe import fused_moe, fused_moe_ref
from kernels.norm_rope.activation import silu_and_mul, silu_and_mul_ref
from kernels.norm_rope.rmsnorm import rmsnorm, rmsnorm_ref
from kernels.norm_rope.rope import apply_rope, apply_rope_ref
from kernels.sparse.indexer_scores import indexer_scores, indexer_scores_ref
from kernels.sparse.sparse_mqa import sparse_mqa_attention, sparse_mqa_attention_ref
from kernels.sparse.window_pool import window_pool, window_pool_ref

GateAct = Callable[[torch.Tensor], torch.Tensor]  # `Ops.silu_mul`: [T, 2I] gate|up -> [T, I]


class SparseAttention(NamedTuple):
    """The sparse attention over per-query key lists (`kernels.sparse`), kernels or their
    references: `mqa(q, kv, indices, sink, scale, entry_kv=, entry_indices=)` attends each
    query over the pool rows its lists name; `indexer_scores(q_idx, weights, keys,
    key_indices)` scores queries against the Lightning Indexer's keys its lists name;
    `window_pool(new_kv, new_gate, kept_kv, kept_gate, index, series, bias)` pools the
    compression windows' inputs into entries."""

    mqa: Callable[..., torch.Tensor]
    indexer_scores: Callable[..., torch.Tensor]
    window_pool: Callable[..., torch.Tensor]


def _add_rmsnorm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return rmsnorm_ref(x, weight, eps, residual=residual)


def _add_rmsnorm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return rmsnorm(x, weight, eps, residual=residual)


def _rows_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1])  # [N, dim], a copy when x is a strided view
    return rmsnorm(rows, weight, eps).view(x.shape)


class TorchOps:
    """The kernels' torch references: float32 math, rounded to the input dtype once.

    - `rmsnorm(x, weight, eps)`: RMSNorm over the last dim of x `[..., dim]`;
    - `add_rmsnorm(x, residual, weight, eps)`: (rmsnorm(x + residual), x + residual);
    - `rope(q, k, positions)`: q `[T, Hq, D]` and k `[T, Hkv, D]` rotated (non-interleaved
      halves, as HF Llama) by the table `cos_sin_cache` `[max_pos, D]` fp32;
    - `silu_mul(x)`: silu(gate) * up of x `[T, 2 * inter]` (gate first);
    - `fused_moe(x, w13, w2, weights, ids)`: the routed experts of x `[T, H]`, w13
      `[E, 2I, H]`, w2 `[E, H, I]`, picks `[T, k]`;
    - `sparse`: DeepSeek-V4's sparse attention, indexer scores and window pooling
      (`SparseAttention`).
    """

    rmsnorm = staticmethod(rmsnorm_ref)
    add_rmsnorm = staticmethod(_add_rmsnorm_ref)
    silu_mul = staticmethod(silu_and_mul_ref)
    fused_moe = staticmethod(fused_moe_ref)
    sparse = SparseAttention(sparse_mqa_attention_ref, indexer_scores_ref, window_pool_ref)

    def __init__(self, cos_sin_cache: torch.Tensor) -> None:
        self.cos_sin_cache = cos_sin_cache  # [max_pos, D] fp32

    def rope(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return apply_rope_ref(q, k, positions, self.cos_sin_cache)


class TritonOps(TorchOps):
    """The same ops through the Triton kernels (GPU)."""

    rmsnorm = staticmethod(_rows_rmsnorm)
    add_rmsnorm = staticmethod(_add_rmsnorm)
    silu_mul = staticmethod(silu_and_mul)
    fused_moe = staticmethod(fused_moe)
    sparse = SparseAttention(sparse_mqa_attention, indexer_scores, window_pool)

    def rope(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        q, k = q.contiguous(), k.contiguous()
        apply_rope(q, k, positions, self.cos_sin_cache)  # in place
        return q, k


def ops_for(device: torch.device, cos_sin_cache: torch.Tensor | None = None) -> TorchOps:
    """The ops of a model on `device`: the Triton kernels on CUDA, the references elsewhere;
    `cos_sin_cache`: the RoPE table of `rope` (None: the model rotates by itself)."""
    return TritonOps(cos_sin_cache) if device.type == "cuda" else TorchOps(cos_sin_cache)
