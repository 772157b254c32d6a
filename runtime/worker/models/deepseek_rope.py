"""DeepSeek's rotary table: default or YaRN frequencies over the rope dims, with YaRN's
attention factor folded into cos and sin, in the layout of `kernels.rope.rope_cos_sin_cache`
(the rotate-half convention; interleaved checkpoints are permuted at load instead, by
`permute_output_rows`)."""

from __future__ import annotations

import math

import torch
from torch import nn

from kernels.gemm.fp8_quant import FP8
from runtime.worker.models.deepseek_arch import yarn_mscale
from runtime.worker.quant.block_fp8_linear import BlockFp8Linear
from runtime.worker.quant.fp8_linear import Fp8Linear, QuantizationError


def yarn_inv_freq(dim: int, rope: dict) -> tuple[torch.Tensor, float]:
    """(frequencies `[dim / 2]` fp32, attention factor) of YaRN, as transformers computes
    them: long wavelengths interpolated by `factor`, short ones kept, a linear ramp between
    the `beta_fast` / `beta_slow` rotation counts."""
    base, factor = rope["rope_theta"], rope["factor"]
    old_len = rope["original_max_position_embeddings"]
    mscale, all_dim = rope.get("mscale"), rope.get("mscale_all_dim")
    attention = rope.get("attention_factor")
    if attention is None:
        attention = (
            yarn_mscale(factor, mscale) / yarn_mscale(factor, all_dim)
            if mscale and all_dim else yarn_mscale(factor)
        )  # fmt: skip
    beta_fast, beta_slow = rope.get("beta_fast") or 32, rope.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rope.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)  # [dim / 2]
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolate = 1 - ramp  # 1: keep the frequency, 0: divide it by factor
    inv_freq = (1.0 / (factor * pos_freqs)) * ramp + (1.0 / pos_freqs) * extrapolate
    return inv_freq, float(attention)


def rope_inv_freq(dim: int, rope: dict) -> tuple[torch.Tensor, float]:
    """(inverse frequencies `[dim / 2]` fp32, attention factor) of a rope dict: YaRN's
    (`rope_type: yarn`) or the default ones (factor 1)."""
    if rope.get("rope_type", "default") == "yarn":
        return yarn_inv_freq(dim, rope)
    return 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2).float() / dim)), 1.0


def deepseek_cos_sin_cache(
    dim: int, max_pos: int, rope: dict, device: torch.device | str
) -> torch.Tensor:
    """`[max_pos, dim]` fp32: cos of every (position, frequency), then sin, each times the
    attention factor (1 unless YaRN)."""
    inv_freq, attention = rope_inv_freq(dim, rope)
    pos = torch.arange(max_pos, dtype=torch.float32, device=device)  # [max_pos]
    freqs = torch.outer(pos, inv_freq.to(device))  # [max_pos, dim / 2]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1) * attention


def deinterleave_perm(dim: int) -> torch.Tensor:
    """Rope dims order `[0, 2, 4, ..., 1, 3, 5, ...]`: applied to the output rows of the
    projections that make q_rope and k_rope, it turns (x0, x1), (x2, x3)... pairs into
    rotate-half halves; scores are unchanged since q and k are permuted alike."""
    return torch.cat([torch.arange(0, dim, 2), torch.arange(1, dim, 2)])


@torch.no_grad()
def permute_output_rows(layer: nn.Module, index: torch.Tensor) -> None:
    """Reorder a projection's output rows in place (row i takes row `index[i]`), 16-bit or fp8.
    Per-channel fp8 scales move with their rows; block scales stay valid only while every row
    stays within its block of rows, else QuantizationError."""
    index = index.to(layer.weight.device)
    if isinstance(layer, BlockFp8Linear):
        rows = torch.arange(len(index), device=index.device)
        if not torch.equal(index // layer.block[0], rows // layer.block[0]):
            raise QuantizationError(
                f"rope rows of a {tuple(layer.weight.shape)} projection move across its "
                f"{layer.block[0]}-row scale blocks: not supported")
    w = layer.weight.view(torch.uint8) if layer.weight.dtype == FP8 else layer.weight
    w.copy_(w[index])  # [out, in], bytes for fp8
    if isinstance(layer, Fp8Linear):
        layer.weight_scale.copy_(layer.weight_scale[index])
