"""DeepSeek's feed-forward layers: a gated MLP (the dense first layers and the shared
experts) and the mixture of experts (router, routed experts, shared experts).

The routed experts' weights are stacked: `w13` holds every expert's gate rows then up rows
and `w2` its down projection, stored flat (`[E * 2I, H]`, `[E * H, I]`) so a checkpoint's
per-expert tensors load as row ranges, and viewed `[E, 2I, H]` / `[E, H, I]` to compute.

Under tensor parallelism every rank holds all E experts at 1/N of their width (I / N
columns of gate and up, the same rows of down), as it holds 1/N of each MLP: each rank's
output is a partial sum, and the layer all-reduces the routed and shared parts at once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.moe import grouped_topk
from runtime.worker.models.deepseek_arch import DeepseekArch
from runtime.worker.models.parallel import column_linear
from runtime.worker.quant.scheme import QuantScheme
from runtime.worker.tp import TPGroup


class GatedMLP(nn.Module):
    """down(silu(gate(x)) * up(x)), gate and up fused into one projection; this rank's
    1/N of the width, stored as `quantization` says for the checkpoint's modules under `hf`.
    Its output is all-reduced, unless `partial` (the caller sums it)."""

    def __init__(self, hidden: int, inter: int, tp: TPGroup, quantization: QuantScheme,
                 hf: str, partial: bool = False) -> None:
        super().__init__()
        self.tp, self.partial = tp, partial
        inter = tp.shard(inter, "the MLP intermediate size")
        self.gate_up_proj = column_linear(hidden, 2 * inter, False, quantization,
                                          [f"{hf}.gate_proj", f"{hf}.up_proj"])
        # this rank's columns of down: its partial sums are reduced below
        self.down_proj = column_linear(inter, hidden, False, quantization, [f"{hf}.down_proj"])

    def forward(self, x: torch.Tensor, ops) -> torch.Tensor:
        y = self.down_proj(self.gate_up_proj(x), gate_act=ops.silu_mul)  # [T, hidden], partial
        return y if self.partial else self.tp.all_reduce(y)


class Router(nn.Module):
    """The gate: one logit per expert (`weight` `[E, hidden]`), plus V3's selection bias."""

    def __init__(self, arch: DeepseekArch) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(arch.n_routed_experts, arch.hidden_size))
        self.e_score_correction_bias = (
            nn.Parameter(torch.empty(arch.n_routed_experts)) if arch.correction_bias else None
        )


class Experts(nn.Module):
    """The routed experts' stacked weights."""

    def __init__(self, arch: DeepseekArch, tp: TPGroup) -> None:
        super().__init__()
        e, h = arch.n_routed_experts, arch.hidden_size
        i = tp.shard(arch.moe_intermediate_size, "the experts' intermediate size")
        self.shape = (e, h, i)
        self.w13 = nn.Parameter(torch.empty(e * 2 * i, h))  # expert e: rows [e*2I, (e+1)*2I)
        self.w2 = nn.Parameter(torch.empty(e * h, i))  # expert e: rows [e*H, (e+1)*H)

    def stacked(self) -> tuple[torch.Tensor, torch.Tensor]:
        e, h, i = self.shape
        return self.w13.view(e, 2 * i, h), self.w2.view(e, h, i)  # [E, 2I, H], [E, H, I]


class DeepseekMoE(nn.Module):
    """Each token goes to `num_experts_per_tok` routed experts (grouped top-k of the
    router's scores), their outputs weighted and summed, plus the shared experts' output."""

    def __init__(self, arch: DeepseekArch, tp: TPGroup, quantization: QuantScheme,
                 hf: str) -> None:
        super().__init__()
        self.arch, self.tp = arch, tp
        self.gate = Router(arch)
        self.experts = Experts(arch, tp)  # 16-bit (an fp8 checkpoint's dequantized at load)
        self.shared_experts = (
            GatedMLP(arch.hidden_size, arch.moe_intermediate_size * arch.n_shared_experts, tp,
                     quantization, f"{hf}.shared_experts", partial=True)
            if arch.n_shared_experts else None
        )  # fmt: skip

    def forward(self, x: torch.Tensor, ops) -> torch.Tensor:
        a = self.arch
        logits = F.linear(x.float(), self.gate.weight.float())  # [T, E] fp32
        weights, ids = grouped_topk(
            logits, a.num_experts_per_tok, n_group=a.n_group, topk_group=a.topk_group,
            scoring_func=a.scoring_func, correction_bias=self.gate.e_score_correction_bias,
            renormalize=a.norm_topk_prob, routed_scaling_factor=a.routed_scaling_factor,
        )  # [T, k] fp32, [T, k] int32  # fmt: skip
        w13, w2 = self.experts.stacked()
        out = ops.fused_moe(x, w13, w2, weights, ids)  # [T, hidden], partial under TP
        if self.shared_experts is not None:
            out = out + self.shared_experts(x, ops)
        return self.tp.all_reduce(out)
