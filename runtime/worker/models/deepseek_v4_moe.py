"""DeepSeek-V4's feed-forward block: routed experts plus one shared expert, every MLP a
SwiGLU whose gate is clamped above and up clamped both ways at `swiglu_limit`.

"moe" layers pick each token's top `num_experts_per_tok` experts by score (sqrt(softplus)
or sigmoid of the router logits) plus a selection bias (`grouped_topk`); "hash_moe" layers
take them from a fixed token -> experts table (`tid2eid`) and only weight them by score.
Either way the picked scores are renormalized to sum to 1, then scaled by
`routed_scaling_factor`. The routed experts run through `ops.fused_moe` with the clamp
(one fused launch on a GPU). The shared expert's projections are stored as the model's
`QuantScheme` says; the routed experts and the router stay in 16 bits (a quantized
checkpoint's are dequantized at load). Under tensor parallelism every rank holds each
expert, the shared one included, at 1/N of its width and the router whole; the routed and
shared partial sums are all-reduced once (`deepseek_v4_tp`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.moe import grouped_topk
from kernels.moe.routing import expert_scores
from runtime.worker.models.deepseek_v4_arch import DeepseekV4Arch
from runtime.worker.models.parallel import column_linear
from runtime.worker.models.sparse_moe import Router, StackedExperts
from runtime.worker.ops import TorchOps
from runtime.worker.quant.scheme import QuantScheme
from runtime.worker.tp import TPGroup

CHECKPOINT_EXPERT_NAMES = ("w1", "w3", "w2")  # gate, up, down


def clamped_swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    return F.silu(gate.clamp(max=limit)) * up.clamp(min=-limit, max=limit)


class SharedExpert(nn.Module):
    """The always-on expert: `w2(swiglu(w1 x, w3 x))`, names as in the checkpoint (under
    `hf`), stored as `quant` says; `inter` this rank's width (its output a partial sum)."""

    def __init__(self, hidden: int, inter: int, limit: float, quant: QuantScheme,
                 hf: str) -> None:
        super().__init__()
        self.limit = limit
        self.w1 = column_linear(hidden, inter, False, quant, [f"{hf}.w1"])
        self.w2 = column_linear(inter, hidden, False, quant, [f"{hf}.w2"])
        self.w3 = column_linear(hidden, inter, False, quant, [f"{hf}.w3"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(clamped_swiglu(self.w1(x), self.w3(x), self.limit))


class V4MoE(nn.Module):
    """Router (`gate`: `weight`, and `bias` or `tid2eid`), stacked routed experts, shared
    expert; this rank's share of the experts' width under `tp`."""

    def __init__(self, arch: DeepseekV4Arch, layer_id: int, quant: QuantScheme,
                 tp: TPGroup) -> None:
        super().__init__()
        a, self.tp = arch, tp
        inter = tp.shard(a.moe_intermediate_size, "moe_intermediate_size")  # this rank's
        self.hashed = a.mlp_layer_types[layer_id] == "hash_moe"
        self.top_k, self.scoring, self.scale = (
            a.num_experts_per_tok, a.scoring_func, a.routed_scaling_factor)
        self.limit = a.swiglu_limit
        self.gate = Router(a.n_routed_experts, a.hidden_size, correction_bias=not self.hashed)
        if self.hashed:
            self.gate.tid2eid = nn.Parameter(
                torch.empty(a.vocab_size, a.num_experts_per_tok, dtype=torch.long),
                requires_grad=False)
        self.experts = StackedExperts(a.n_routed_experts, a.hidden_size,
                                      a.moe_intermediate_size, tp)
        self.shared_experts = SharedExpert(a.hidden_size, inter, self.limit, quant,
                                           f"model.layers.{layer_id}.ffn.shared_experts")

    def route(self, x: torch.Tensor, input_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(weights `[T, k]` fp32, expert ids `[T, k]`) of each token."""
        logits = F.linear(x.float(), self.gate.weight.float())  # [T, E]
        if not self.hashed:
            return grouped_topk(logits, self.top_k, scoring_func=self.scoring,
                                correction_bias=self.gate.e_score_correction_bias,
                                renormalize=True, routed_scaling_factor=self.scale)
        ids = self.gate.tid2eid[input_ids]  # [T, k]
        weights = expert_scores(logits, self.scoring).gather(1, ids)
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * self.scale, ids

    def forward(self, x: torch.Tensor, input_ids: torch.Tensor, ops: TorchOps) -> torch.Tensor:
        """`x` `[T, hidden]` (normed) of tokens `input_ids` `[T]`: `[T, hidden]`."""
        weights, ids = self.route(x, input_ids)
        w13, w2 = self.experts.stacked()  # [E, 2I, H], [E, H, I]
        routed = ops.fused_moe(x, w13, w2, weights, ids, swiglu_limit=self.limit)
        return self.tp.all_reduce(routed + self.shared_experts(x))  # partial sums under TP
