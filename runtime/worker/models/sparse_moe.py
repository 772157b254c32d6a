"""A sparse mixture-of-experts block, as every MoE family here runs it: a router scores the
experts per token, each token goes to its top k (`kernels.moe.grouped_topk`), and the picked
experts' gated MLPs run as one fused launch (`ops.fused_moe`), weighted and summed.

The experts' weights are stacked: `w13` holds every expert's gate rows then up rows and `w2`
its down projection, stored flat (`[E * 2I, H]`, `[E * H, I]`) so a checkpoint's per-expert
tensors load as row ranges (`expert_pieces`), and viewed `[E, 2I, H]` / `[E, H, I]` to
compute. They and the router stay in the model's dtype whatever the projections' storage (the
fused MoE kernel reads 16-bit weights): an fp8 checkpoint's are dequantized at load.

Under tensor parallelism every rank holds all E experts at 1/N of their width (I / N
columns of gate and up, the same columns of down), as it holds 1/N of a dense MLP: each
rank's output is a partial sum, all-reduced once per block. The router is replicated.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from kernels.moe import grouped_topk
from runtime.worker.tp import TPGroup

# checkpoint module names of one expert's gate, up and down projections
EXPERT_NAMES = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Routing:
    """How a token picks its experts: `grouped_topk`'s arguments."""

    top_k: int
    n_group: int = 1
    topk_group: int = 1
    scoring_func: str = "softmax"
    renormalize: bool = False
    routed_scaling_factor: float = 1.0


class Router(nn.Module):
    """The gate: one logit per expert (`weight` `[E, hidden]`), plus an optional selection
    bias per expert (DeepSeek-V3's `e_score_correction_bias`)."""

    def __init__(self, num_experts: int, hidden: int, correction_bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden))
        self.e_score_correction_bias = (
            nn.Parameter(torch.empty(num_experts)) if correction_bias else None
        )


class StackedExperts(nn.Module):
    """The routed experts' stacked weights, this rank's 1/N of each expert's width."""

    def __init__(self, num_experts: int, hidden: int, inter: int, tp: TPGroup) -> None:
        super().__init__()
        e, h = num_experts, hidden
        i = tp.shard(inter, "the experts' intermediate size")
        self.shape = (e, h, i)
        self.w13 = nn.Parameter(torch.empty(e * 2 * i, h))  # expert e: rows [e*2I, (e+1)*2I)
        self.w2 = nn.Parameter(torch.empty(e * h, i))  # expert e: rows [e*H, (e+1)*H)

    def stacked(self) -> tuple[torch.Tensor, torch.Tensor]:
        e, h, i = self.shape
        return self.w13.view(e, 2 * i, h), self.w2.view(e, h, i)  # [E, 2I, H], [E, H, I]


def expert_pieces(leaf: str, param: torch.Tensor, num_experts: int,
                  names: tuple[str, str, str] = EXPERT_NAMES) -> list[tuple[str, int, int]]:
    """The checkpoint tensors that fill stacked parameter `leaf` ("w13" or "w2") of
    `StackedExperts`, named relative to the MoE block: `experts.{e}.{gate}.weight` then
    `experts.{e}.{up}.weight` for w13, `experts.{e}.{down}.weight` for w2, as
    (name, first row, row count)."""
    gate, up, down = names
    if leaf == "w13":
        i = param.shape[0] // (2 * num_experts)  # this rank's width
        return [piece for e in range(num_experts)
                for piece in ((f"experts.{e}.{gate}.weight", 2 * i * e, i),
                              (f"experts.{e}.{up}.weight", 2 * i * e + i, i))]
    h = param.shape[0] // num_experts
    return [(f"experts.{e}.{down}.weight", h * e, h) for e in range(num_experts)]


class SparseMoeBlock(nn.Module):
    """Router (`gate`) plus stacked experts: each token's output is the routing-weighted sum
    of its top-k experts' gated MLPs. `forward` all-reduces over the TP group; `routed`
    gives this rank's partial sum, for a subclass that adds more before the all-reduce."""

    def __init__(self, num_experts: int, hidden: int, inter: int, routing: Routing,
                 tp: TPGroup, correction_bias: bool = False) -> None:
        super().__init__()
        self.routing, self.tp = routing, tp
        self.gate = Router(num_experts, hidden, correction_bias)
        self.experts = StackedExperts(num_experts, hidden, inter, tp)

    def routed(self, x: torch.Tensor, ops) -> torch.Tensor:
        """This rank's share of the routed experts' output for x `[T, hidden]`: `[T, hidden]`."""
        logits = F.linear(x.float(), self.gate.weight.float())  # [T, E] fp32
        weights, ids = grouped_topk(
            logits, correction_bias=self.gate.e_score_correction_bias, **asdict(self.routing)
        )  # [T, k] fp32, [T, k] int32
        w13, w2 = self.experts.stacked()
        return ops.fused_moe(x, w13, w2, weights, ids)  # [T, hidden], partial under TP

    def forward(self, x: torch.Tensor, ops) -> torch.Tensor:
        return self.tp.all_reduce(self.routed(x, ops))  # [T, hidden]
