"""Mixture-of-experts kernels: routing (`grouped_topk`) and the expert FFN (`fused_moe`)."""

from kernels.moe.align import MoeAlignment, moe_align_block_size
from kernels.moe.fused import MoeConfig, fused_moe, fused_moe_ref, moe_config
from kernels.moe.routing import grouped_topk

__all__ = [
    "MoeAlignment",
    "MoeConfig",
    "fused_moe",
    "fused_moe_ref",
    "grouped_topk",
    "moe_align_block_size",
    "moe_config",
]
