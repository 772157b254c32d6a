"""DeepSeek's feed-forward layers: a gated MLP (the dense first layers and the shared
experts) and the mixture of experts (the shared sparse block of `sparse_moe.py`: router and
stacked routed experts, with grouped top-k routing; plus the shared experts).

Under tensor parallelism every rank holds 1/N of each MLP's width and of every expert's:
the layer all-reduces the routed and shared parts at once.
"""

from __future__ import annotations

import torch
from torch import nn

from runtime.worker.models.deepseek_arch import DeepseekArch
from runtime.worker.models.parallel import column_linear
from runtime.worker.models.sparse_moe import Routing, SparseMoeBlock
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


class DeepseekMoE(SparseMoeBlock):
    """Each token goes to `num_experts_per_tok` routed experts (grouped top-k of the
    router's scores), their outputs weighted and summed, plus the shared experts' output."""

    def __init__(self, arch: DeepseekArch, tp: TPGroup, quantization: QuantScheme,
                 hf: str) -> None:
        routing = Routing(
            arch.num_experts_per_tok, n_group=arch.n_group, topk_group=arch.topk_group,
            scoring_func=arch.scoring_func, renormalize=arch.norm_topk_prob,
            routed_scaling_factor=arch.routed_scaling_factor,
        )  # fmt: skip
        super().__init__(arch.n_routed_experts, arch.hidden_size, arch.moe_intermediate_size,
                         routing, tp, correction_bias=arch.correction_bias)
        self.shared_experts = (
            GatedMLP(arch.hidden_size, arch.moe_intermediate_size * arch.n_shared_experts, tp,
                     quantization, f"{hf}.shared_experts", partial=True)
            if arch.n_shared_experts else None
        )  # fmt: skip

    def forward(self, x: torch.Tensor, ops) -> torch.Tensor:
        out = self.routed(x, ops)  # [T, hidden], this rank's
        if self.shared_experts is not None:
            out = out + self.shared_experts(x, ops)
        return self.tp.all_reduce(out)
