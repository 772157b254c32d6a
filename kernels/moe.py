"""Mixture-of-experts kernels: routing (`grouped_topk`) and the expert FFN (`fused_moe`)."""

from kernels.fused_moe import fused_moe_ref
from kernels.moe_routing import grouped_topk

__all__ = ["fused_moe_ref", "grouped_topk"]
