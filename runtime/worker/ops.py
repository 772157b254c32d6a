"""Elementwise layer ops behind one interface: exact torch on the CPU, Triton kernels on GPU.

The model calls `ops.rmsnorm`, `ops.add_rmsnorm` (residual add fused with the norm),
`ops.rope` and `ops.silu_mul`; `TorchOps` computes them exactly as transformers does
(the CPU correctness reference), `TritonOps` launches the kernels in `kernels/`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class TorchOps:
    """Plain torch: fp32 norm statistics, scale applied in the input dtype."""

    def __init__(self, inv_freq: torch.Tensor) -> None:
        self.inv_freq = inv_freq  # [D/2] fp32

    @staticmethod
    def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.float()  # [T, dim]
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return weight * xf.to(x.dtype)

    def add_rmsnorm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                    eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(rmsnorm(x + residual), x + residual)."""
        h = x + residual  # [T, dim]
        return self.rmsnorm(h, weight, eps), h

    def rope(self, q: torch.Tensor, k: torch.Tensor,
             positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate q [T, Hq, D] and k [T, Hkv, D] (non-interleaved halves, as HF Llama)."""
        freqs = positions.float()[:, None] * self.inv_freq[None, :]  # [T, D/2]
        angles = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # [T, 1, D]
        cos, sin = angles.cos().to(q.dtype), angles.sin().to(q.dtype)
        return _rotate(q, cos, sin), _rotate(k, cos, sin)

    @staticmethod
    def silu_mul(x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)  # [T, inter] each
        return F.silu(gate) * up


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)  # [T, H, D/2] each
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin  # [T, H, D]


class TritonOps:
    """The same ops through the Triton kernels (GPU)."""

    def __init__(self, cos_sin_cache: torch.Tensor) -> None:
        self.cos_sin_cache = cos_sin_cache  # [max_pos, D] fp32

    @staticmethod
    def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        from kernels.rmsnorm import rmsnorm

        return rmsnorm(x, weight, eps)

    @staticmethod
    def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                    eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        from kernels.rmsnorm import rmsnorm

        return rmsnorm(x, weight, eps, residual=residual)

    def rope(self, q: torch.Tensor, k: torch.Tensor,
             positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        from kernels.rope import apply_rope

        q, k = q.contiguous(), k.contiguous()
        apply_rope(q, k, positions, self.cos_sin_cache)
        return q, k

    @staticmethod
    def silu_mul(x: torch.Tensor) -> torch.Tensor:
        from kernels.activation import silu_and_mul

        return silu_and_mul(x)
