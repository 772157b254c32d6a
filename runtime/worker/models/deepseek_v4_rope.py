"""DeepSeek-V4's RoPE: interleaved pairs `(x0, x1), (x2, x3)...` of the last `rope_dim`
values of each head, default or YaRN frequencies (`deepseek_rope.rope_inv_freq`), and the
inverse rotation V4 applies to attention outputs (their values carry the keys' rotation)."""

from __future__ import annotations

import torch


def apply_rope(x: torch.Tensor, positions: torch.Tensor, freqs: tuple[torch.Tensor, float],
               inverse: bool = False) -> torch.Tensor:
    """`x` `[N, ..., D]` with its last `2 * len(inv_freq)` values rotated in interleaved
    pairs at `positions` `[N]` (backwards with `inverse`), computed in fp32, in x's dtype."""
    inv_freq, attention = freqs
    rd = 2 * inv_freq.shape[0]
    angles = positions.float()[:, None] * inv_freq  # [N, rd / 2] (inv_freq on x's device)
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (rd // 2,)
    cos = (angles.cos() * attention).view(shape)
    sin = (angles.sin() * attention).view(shape) * (-1.0 if inverse else 1.0)
    rope = x[..., -rd:].float()
    even, odd = rope[..., 0::2], rope[..., 1::2]  # [N, ..., rd / 2] each
    rotated = torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1)
    return torch.cat([x[..., :-rd], rotated.flatten(-2).to(x.dtype)], dim=-1)
